"""Rendered manifests read as a person reads YAML (newcomer review, defect 14): the node
agent's source as a `|` block line for line, no `&id001` anchors, and the same objects."""

from __future__ import annotations

import yaml

from tandem.rankplan import template_plan
from tandem.render.kubernetes import objects, to_yaml
from tests.k8s.manifests import deployments


def test_the_yaml_is_the_objects_with_blocks_and_no_anchors():
    for name, deployment in deployments().items():
        items = objects(template_plan(deployment), deployment)
        text = to_yaml(items)
        assert list(yaml.safe_load_all(text)) == items, name
        assert "&id0" not in text and "*id0" not in text, name
        assert "  agent.py: |\n" in text, name
        longest = max(len(line) for line in text.splitlines())
        assert longest < 300, f"{name}: a line of {longest} characters"
