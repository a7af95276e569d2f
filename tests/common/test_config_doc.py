"""docs/configuration.md is what the config dataclasses say (scripts/config_doc.py writes it)."""

import subprocess
import sys

from tests.conftest import REPO


def test_the_configuration_reference_is_current():
    out = subprocess.run([sys.executable, "scripts/config_doc.py", "--check"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_every_field_of_every_service_is_in_the_reference():
    import dataclasses

    from services.compiler.config import CompilerConfig
    from services.engine.config import EngineConfig
    from services.openai.config import OpenAIConfig
    from services.router.config import RouterConfig

    doc = (REPO / "docs" / "configuration.md").read_text()
    for service, cls in (("ROUTER", RouterConfig), ("COMPILER", CompilerConfig), ("ENGINE", EngineConfig),
                         ("OPENAI", OpenAIConfig)):
        for f in dataclasses.fields(cls):
            assert f"`NEXUS_{service}_{f.name.upper()}`" in doc, f.name
