"""The programs that stand in for what this machine cannot run (``kube_cluster``): the
LeaderWorkerSet controller, CoreDNS, Cilium's load-balancer addresses. Each reads the real API
server and acts as its original would, twice a second, in one thread (``StandIns``).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Protocol

from k8s import lws_pods
from k8s.apiserver import ApiServer

DNS_DOMAIN = "cluster.local"


class Part(Protocol):
    def sync(self) -> None: ...


class ApiClient:
    """Plain HTTPS against the API server with the admin token (the stand-ins' loop would
    spend most of a core starting kubectl twice a second)."""

    def __init__(self, server: ApiServer) -> None:
        self.url = server.url
        self.headers = {"Authorization": f"Bearer {server.token}"}
        self.context = ssl.create_default_context()
        self.context.check_hostname = False
        self.context.verify_mode = ssl.CERT_NONE

    def request(self, method: str, path: str, body: dict | None = None, *, patch: bool = False):
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            kind = "merge-patch+json" if patch else "json"
            headers["Content-Type"] = f"application/{kind}"
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        with urllib.request.urlopen(request, context=self.context, timeout=10) as answer:
            return json.loads(answer.read() or b"{}")

    def items(self, path: str) -> list[dict]:
        return self.request("GET", path).get("items") or []


class LwsStandIn:
    """Creates the pods of every LeaderWorkerSet as LWS v0.10.0 would (``lws_pods``): each
    object once, retried until the server takes it (the namespace's ServiceAccount may not
    exist yet). Nothing after creation: no restart of a group, no status."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.done: set[str] = set()
        self.created: list[str] = []
        self.errors: list[str] = []

    def sync(self) -> None:
        for lws in self.api.items("/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets"):
            uid = lws["metadata"]["uid"]
            if uid in self.done or lws["metadata"].get("deletionTimestamp"):
                continue
            try:
                made = lws_pods.objects(lws)
            except lws_pods.Unsupported as exc:
                self.errors.append(str(exc))
                self.done.add(uid)
                continue
            if all(self._create(o) for o in made):
                self.done.add(uid)

    def _create(self, obj: dict) -> bool:
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        plural = "pods" if obj["kind"] == "Pod" else "services"
        try:
            self.api.request("POST", f"/api/v1/namespaces/{namespace}/{plural}", obj)
        except urllib.error.HTTPError as exc:
            if exc.code == 409:  # made already
                return True
            self.errors.append(f"{obj['kind']} {name}: {exc.code} {exc.read()[:300]!r}")
            return False
        self.created.append(f"{obj['kind'].lower()}/{name}")
        return True


class ClusterDns:
    """The cluster's names in dnsmasq's hosts folder, as CoreDNS's ``kubernetes`` plugin names
    them: ``SVC.NS.svc.cluster.local`` for a Service's cluster IP, and for a headless Service
    its endpoints' addresses, each also as ``HOSTNAME.SVC.NS.svc.cluster.local`` where the
    endpoint has a hostname (a pod whose ``subdomain`` is the Service)."""

    def __init__(self, api: ApiClient, folder: Path) -> None:
        self.api = api
        self.file = folder / "cluster"
        self.text = ""

    def records(self) -> list[tuple[str, str]]:
        records = []
        for svc in self.api.items("/api/v1/services"):
            meta, ip = svc["metadata"], svc["spec"].get("clusterIP")
            if ip and ip != "None":
                records.append((ip, f"{meta['name']}.{meta['namespace']}.svc.{DNS_DOMAIN}"))
        headless = {
            (s["metadata"]["namespace"], s["metadata"]["name"])
            for s in self.api.items("/api/v1/services")
            if s["spec"].get("clusterIP") == "None"
        }
        for ep in self.api.items("/api/v1/endpoints"):
            meta = ep["metadata"]
            if (meta["namespace"], meta["name"]) not in headless:
                continue
            base = f"{meta['name']}.{meta['namespace']}.svc.{DNS_DOMAIN}"
            for subset in ep.get("subsets") or []:
                for address in subset.get("addresses", []) + subset.get("notReadyAddresses", []):
                    records.append((address["ip"], base))
                    if address.get("hostname"):
                        records.append((address["ip"], f"{address['hostname']}.{base}"))
        return records

    def sync(self) -> None:
        text = "".join(f"{ip} {name}\n" for ip, name in sorted(set(self.records())))
        if text != self.text:
            temporary = self.file.with_suffix(".new")
            temporary.write_text(text)
            temporary.rename(self.file)  # dnsmasq rereads a hosts folder's file on IN_MOVED_TO
            self.text = text


class LoadBalancers:
    """Cilium's LB-IPAM and BGP, for a Service of type LoadBalancer that names its address in
    ``io.cilium/lb-ipam-ips``: the address goes into the Service's status (kube-proxy then
    forwards it, as on any node) and is routed from this machine to the node of a ready
    endpoint (BGP announces it from there; ``externalTrafficPolicy: Local`` drops it
    elsewhere)."""

    ANNOTATION = "io.cilium/lb-ipam-ips"

    def __init__(self, api: ApiClient, address_of: dict[str, str]) -> None:
        self.api = api
        self.address_of = address_of
        self.routes: dict[str, str] = {}

    def sync(self) -> None:
        for svc in self.api.items("/api/v1/services"):
            meta, spec = svc["metadata"], svc["spec"]
            ip = (meta.get("annotations") or {}).get(self.ANNOTATION)
            if spec.get("type") != "LoadBalancer" or not ip:
                continue
            if not (svc.get("status") or {}).get("loadBalancer", {}).get("ingress"):
                path = f"/api/v1/namespaces/{meta['namespace']}/services/{meta['name']}/status"
                body = {"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}
                self.api.request("PATCH", path, body, patch=True)
            self._route(ip, self._endpoint_node(meta["namespace"], meta["name"]))

    def _endpoint_node(self, namespace: str, name: str) -> str | None:
        try:
            ep = self.api.request("GET", f"/api/v1/namespaces/{namespace}/endpoints/{name}")
        except urllib.error.HTTPError:
            return None
        for subset in ep.get("subsets") or []:
            for address in subset.get("addresses") or []:
                if address.get("nodeName") in self.address_of:
                    return self.address_of[address["nodeName"]]
        return None

    def _route(self, ip: str, via: str | None) -> None:
        if self.routes.get(ip) == via:
            return
        if via is None:
            subprocess.run(["ip", "route", "del", f"{ip}/32"], capture_output=True)
        else:
            subprocess.run(["ip", "route", "replace", f"{ip}/32", "via", via], check=True)
        self.routes[ip] = via  # type: ignore[assignment]


class StandIns(threading.Thread):
    """The stand-ins' loop: every half second, each of them once."""

    def __init__(self, parts: list[Part]) -> None:
        super().__init__(daemon=True, name="k8s-stand-ins")
        self.parts = parts
        self.stopping = threading.Event()
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stopping.wait(0.5):
            for part in self.parts:
                try:
                    part.sync()
                except (
                    OSError,
                    urllib.error.URLError,
                    ValueError,
                    subprocess.SubprocessError,
                ) as exc:
                    self.failures.append(f"{type(part).__name__}: {exc}")

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)
