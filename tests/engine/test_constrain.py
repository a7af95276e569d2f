import numpy as np
import pytest

from services.engine.constrain import TokenTrie, choose_constrained

VOCAB = {"git": 1, "_": 2, "status": 3, "log": 4, "hub": 5, "x": 6, "list": 7}


def tok(name):
    # a toy tokenizer: split on the vocabulary greedily
    out, i = [], 0
    while i < len(name):
        for w, t in sorted(VOCAB.items(), key=lambda kv: -len(kv[0])):
            if name.startswith(w, i):
                out.append(t)
                i += len(w)
                break
        else:
            raise ValueError(name[i:])
    return out


def logits_preferring(*order):
    def fn(chosen):
        v = np.zeros(10)
        for rank, t in enumerate(order):
            v[t] = 10 - rank
        return v
    return fn


def test_mask_never_leaves_the_registry():
    trie = TokenTrie(["git_status", "git_log", "github_x"], tok)
    # The model "wants" token 6 ('x') first, which no name starts with: the mask forbids it.
    name, steps = choose_constrained(trie, logits_preferring(6, 1, 2, 4))
    assert name == "git_log" and steps == 3


def test_unique_prefix_is_implied_without_decoding():
    trie = TokenTrie(["git_status", "list"], tok)
    name, steps = choose_constrained(trie, logits_preferring(7, 1))
    assert name == "list" and steps == 1


def test_a_name_that_prefixes_another_can_win():
    trie = TokenTrie(["git", "git_status"], tok)
    # after 'git' the model prefers a token that continues nothing (9) over '_' (2): stop at "git"
    name, _ = choose_constrained(trie, logits_preferring(1, 9, 2))
    assert name == "git"
    def step_dependent(chosen):
        v = np.zeros(10)
        v[[1, 2, 3][len(chosen)]] = 5.0  # step k prefers the k-th token of "git_status"
        return v

    name, _ = choose_constrained(trie, step_dependent)
    assert name == "git_status"


def test_empty_registry_is_an_error():
    with pytest.raises(ValueError):
        TokenTrie([], tok)
