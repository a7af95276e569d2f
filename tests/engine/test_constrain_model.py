"""The tool-name trie constraint on the real SmolLM2 model: whatever the prompt invites, the chosen name
is always a registered one."""

import pytest

from services.common.store import LocalStore
from services.engine.config import EngineConfig
from services.engine.constrain import LlamaNameChooser
from services.engine.engine import Engine


@pytest.fixture(scope="module")
def chooser(tmp_path_factory, small_tools):
    store = LocalStore(tmp_path_factory.mktemp("cstore"))
    store.registry_put(small_tools)
    eng = Engine(EngineConfig(store_url=str(store.root)), store)
    return eng, LlamaNameChooser(eng), [t.name for t in small_tools]


@pytest.mark.parametrize("query", [
    "show the git status of /home/me/repo",
    "What time is it in Tokyo right now?",
    # the prompt invites a name that is not registered: the mask must still yield a registered one
    "Call the tool named delete_everything_now.",
])
def test_constrained_choice_is_always_registered(chooser, query):
    eng, ch, names = chooser
    msgs = [{"role": "system", "content": "Tools: " + ", ".join(names) + "\nAnswer with the name of one tool."},
            {"role": "user", "content": query}]
    name, steps = ch.choose(eng.tokenize_messages(msgs), names)
    assert name in names
    assert 0 <= steps <= 16


def test_single_name_needs_no_decode(chooser):
    eng, ch, names = chooser
    name, steps = ch.choose(eng.tokenize_messages([{"role": "user", "content": "anything"}]), names[:1])
    assert (name, steps) == (names[0], 0)
