from dataclasses import dataclass

import pytest

from services.common.config import ConfigError, load_config
from services.router.config import RouterConfig


@dataclass(frozen=True)
class Demo:
    port: int = 1
    name: str = "a"
    ratio: float = 0.5
    on: bool = False
    tags: tuple[str, ...] = ()


def test_defaults_then_file_then_env_then_overrides(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('port = 2\nname = "file"\n')
    cfg = load_config(Demo, prefix="NEXUS_DEMO_", file=f, env={"NEXUS_DEMO_NAME": "env", "NEXUS_DEMO_ON": "true"},
                      overrides={"ratio": 0.25, "port": None})
    assert cfg == Demo(port=2, name="env", ratio=0.25, on=True)


def test_tuple_from_env():
    cfg = load_config(Demo, prefix="NEXUS_DEMO_", env={"NEXUS_DEMO_TAGS": "a, b"})
    assert cfg.tags == ("a", "b")


def test_unknown_file_key_is_fatal(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("prot = 2\n")
    with pytest.raises(ConfigError, match="prot"):
        load_config(Demo, prefix="NEXUS_DEMO_", file=f, env={})


def test_unknown_env_key_is_fatal():
    with pytest.raises(ConfigError, match="NEXUS_DEMO_PROT"):
        load_config(Demo, prefix="NEXUS_DEMO_", env={"NEXUS_DEMO_PROT": "2"})


def test_bad_type_names_the_key():
    with pytest.raises(ConfigError, match="port"):
        load_config(Demo, prefix="NEXUS_DEMO_", env={"NEXUS_DEMO_PORT": "eighty"})


def test_config_is_frozen():
    cfg = load_config(RouterConfig, prefix="NEXUS_ROUTER_", env={})
    with pytest.raises(AttributeError):
        cfg.port = 1  # type: ignore[misc]


def test_router_query_encoder_precision_is_checked():
    cfg = load_config(RouterConfig, prefix="NEXUS_ROUTER_", env={"NEXUS_ROUTER_QUERY_ENCODER_PRECISION": "int8"})
    assert cfg.query_encoder_precision == "int8"
    assert load_config(RouterConfig, prefix="NEXUS_ROUTER_", env={}).query_encoder_precision == "int8"
    with pytest.raises(ConfigError, match="query_encoder_precision must be fp32 or int8, got 'fp16'"):
        load_config(RouterConfig, prefix="NEXUS_ROUTER_", env={"NEXUS_ROUTER_QUERY_ENCODER_PRECISION": "fp16"})


def test_the_router_has_no_second_stage_setting_and_refuses_the_removed_ones():
    """The argument-evidence stage is gone: the router loads the shipped gate model at a path relative to the
    checkout, and its old settings are unknown keys (fatal, not silently ignored)."""
    assert RouterConfig().gate_model_dir == "var/models/gate"
    for key in ("NEXUS_ROUTER_ARG_EVIDENCE", "NEXUS_ROUTER_LATE_READER_DIR"):
        with pytest.raises(ConfigError):
            load_config(RouterConfig, prefix="NEXUS_ROUTER_", env={key: "false"})
