"""The compile caches of the ranks: the same on every rank, or cold on all of them.

vLLM's multi-node start waits at barriers while each rank compiles, JIT-builds and autotunes.
A rank that finds these in its cache while another works them out leaves the fast ones waiting
until the barrier times out: 1800 s, then a failed start (vLLM issues 57423 and 52291, on GB10).
So a rank whose cache key (``tandem.caches``) differs from the leader's is an error found
before launch, with the way back to a symmetric start.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from tandem import caches
from tandem.check.findings import Finding, Severity
from tandem.check.rules.context import MIB, CheckContext, few, listing
from tandem.spec.cluster import Transport

_SHOWN = 4
"""Differing entries named in a finding's evidence."""


def _describe(cache: dict[str, Any]) -> str:
    key = caches.cache_key(cache)
    if not key:
        return "cold"
    folders = (cache.get("folders") or {}).values()
    files = sum(f.get("files") or 0 for f in folders)
    size = sum(f.get("bytes") or 0 for f in folders)
    return f"warm, key {key} ({files} files, {size / MIB:.1f} MiB)"


class CacheParityRule:
    """Every rank's compile cache has the leader's key, or every rank's is cold."""

    name = "cache-parity"

    def check(self, ctx: CheckContext) -> Iterable[Finding]:
        found = {
            node.name: facts["compile_cache"]
            for node, facts in ctx.probed()
            if isinstance(facts.get("compile_cache"), dict)
        }
        leader = ctx.nodes[0].name
        if leader not in found:  # no leader facts (probe-failed says why): nothing to compare
            return
        keys = {node: caches.cache_key(cache) for node, cache in found.items()}
        states = {node: _describe(cache) for node, cache in found.items()}
        if len(set(keys.values())) == 1:
            warm = next(iter(keys.values()))
            eager = ctx.deployment.recipe.engine.serve.enforce_eager
            yield Finding(
                rule=self.name,
                severity=Severity.INFO,
                node=None,
                message=(
                    f"compile caches {'warm' if warm else 'cold'} on every rank"
                    + (f" (key {warm})" if warm else "")
                    + ": enforce_eager is on, so no model graph is compiled; vLLM still "
                    "compiles a few helpers of its own at the first request (with TP > 1, "
                    "the vocabulary mask) and keeps them here"
                    if eager
                    else f"compile caches warm on every rank (key {warm}): this start loads "
                    "compiled graphs and tuned kernels"
                    if warm
                    else "compile caches cold on every rank: this start compiles and tunes, "
                    "the next one is warm"
                ),
                evidence=listing(states),
                fix="nothing to do",
            )
            return
        name = ctx.deployment.name
        cluster = "" if ctx.deployment.cluster.transport is Transport.LOCAL else " --cluster FILE"
        for node, key in keys.items():
            if node == leader or key == keys[leader]:
                continue
            here, there = caches.differences(found[node], found[leader])
            detail = "; ".join(
                part
                for part in (
                    f"only here: {few(here, _SHOWN)}" if here else "",
                    f"only on {leader}: {few(there, _SHOWN)}" if there else "",
                )
                if part
            )
            yield Finding(
                rule=self.name,
                severity=Severity.ERROR,
                node=node,
                message=(
                    f"this rank's compile cache ({states[node].split(',')[0]}) differs from "
                    f"the leader's ({states[leader].split(',')[0]}): the rank that has less "
                    "to compile waits at a barrier until it times out (vLLM issue 57423)"
                ),
                evidence=(
                    f"{node}: {found[node].get('root')} {states[node]}; {leader}: "
                    f"{found[leader].get('root')} {states[leader]}"
                    + (f"; {detail}" if detail else "")
                ),
                fix=(
                    f"`tandem down {name} --purge-caches{cluster}` clears every rank's cache, "
                    "so all start cold together; or copy the leader's: rsync -a "
                    f"{leader}:{found[leader].get('root')}/ {node}:{found[node].get('root')}/"
                ),
            )
