"""The Home Assistant add-on definition: the keys the add-on store requires, an option schema of
valid types whose defaults it accepts, and every option mapped to an existing server flag."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from wyoming_kazeia import __version__
from wyoming_kazeia.__main__ import build_parser
from wyoming_kazeia.settings import QUANT_TYPES, EngineSettings

ADDON = Path(__file__).resolve().parents[1] / "addon" / "kazeia_tts"
SCHEMA_TYPE = re.compile(
    r"^(str|bool|email|url|password|port|match\(.+\)|"
    r"int(\((-?\d+)?,(-?\d+)?\))?|float(\(([-\d.]+)?,([-\d.]+)?\))?|list\(([^|()]+\|)*[^|()]+\))"
    r"\??$"
)


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((ADDON / name).read_text())
    assert isinstance(data, dict), name
    return data


def accepts(schema: str, value: Any) -> bool:
    """Whether the add-on store's schema type `schema` accepts `value`."""
    optional = schema.endswith("?")
    kind = schema.rstrip("?")
    if value in ("", None):
        return optional
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind.startswith("int"):
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        bounds = re.findall(r"-?\d+", kind)
        return not bounds or int(bounds[0]) <= value <= int(bounds[1])
    if kind.startswith("list("):
        return value in kind[5:-1].split("|")
    return True


def test_config_has_what_the_store_requires() -> None:
    config = load("config.yaml")
    for key in ("name", "version", "slug", "description", "arch", "options", "schema"):
        assert key in config, key
    assert config["version"] == __version__
    assert re.fullmatch(r"[a-z0-9_]+", config["slug"])
    assert {"amd64", "aarch64"} <= set(config["arch"])
    assert "wyoming" in config["discovery"]
    assert config["ports"] == {"10200/tcp": 10200}
    assert "mqtt:want" in config["services"]
    assert config["backup_exclude"], "the model folders stay out of backups"
    build = load("build.yaml")
    assert set(config["arch"]) <= set(build["build_from"])
    assert "name" in yaml.safe_load((ADDON.parent / "repository.yaml").read_text())
    for name in ("Dockerfile", "run.sh", "DOCS.md", "translations/en.yaml"):
        assert (ADDON / name).is_file(), name


def test_option_schema_is_valid_and_accepts_its_defaults() -> None:
    config = load("config.yaml")
    options, schema = config["options"], config["schema"]
    assert set(options) == set(schema)
    for name, kind in schema.items():
        assert SCHEMA_TYPE.match(kind), (name, kind)
        assert accepts(kind, options[name]), (name, options[name])
    # The add-on offers what the server accepts, from the settings' declared bounds.
    assert schema["quant"] == f"list({'|'.join(QUANT_TYPES)})"
    threads = EngineSettings.bounds("threads")
    assert schema["threads"] == f"int({threads.low:g},{threads.high:g})"
    translated = load("translations/en.yaml")["configuration"]
    assert set(translated) == set(options)


@pytest.mark.parametrize("name", list(load("config.yaml")["options"]))
def test_every_option_maps_to_a_server_flag(name: str) -> None:
    run = (ADDON / "run.sh").read_text()
    assert f"bashio::config '{name}'" in run or f"bashio::config.true '{name}'" in run
    flags = {s for action in build_parser()._actions for s in action.option_strings}
    used = set(re.findall(r"(--[a-z][a-z-]+)", run))
    assert used <= flags, used - flags
    assert f"--{name.replace('_', '-')}" in used
