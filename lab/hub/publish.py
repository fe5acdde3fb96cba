"""Compose the Hub stand-in's repositories (lab/hub/repos.yaml) into ``<mirror>/hub``.

Each repository is rebuilt only when its inputs change (the catalog entry, the model
record, tools/compose_checkpoint.py and these modules): ``repo.json`` keeps their digest,
so a rerun of ``python -m lab up`` costs a few stat calls. Checkpoints come from
tools/compose_checkpoint.py (real safetensors headers from the record, data sparse or
pseudo-random); the lab adds what a Hub repository also holds: ``.gitattributes`` (its
LFS rules decide which files are LFS), ``README.md`` (a model card saying it is
composed), ``generation_config.json`` and, for the small ones, a tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

import yaml

from lab.hub import store

HERE = Path(__file__).resolve().parent
CATALOG = HERE / "repos.yaml"
SUBDIR = "hub"


def hub_root(mirror_root: Path | str) -> Path:
    return Path(mirror_root) / SUBDIR


def catalog() -> dict:
    return yaml.safe_load(CATALOG.read_text())


def _compose_tool():
    from lab.models import compose_tool

    return compose_tool()


def tokenizer_files(vocab_size: int) -> dict[str, bytes]:
    """A word-level tokenizer in the ``tokenizers`` JSON format with ``vocab_size``
    entries (``<unk>``, ``<s>``, ``</s>``, then ``t3``, ``t4``, ...), and its config."""
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(specials)}
    vocab.update({f"t{i}": i for i in range(len(specials), vocab_size)})
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, t in enumerate(specials)],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>",
              "eos_token": "</s>", "unk_token": "<unk>", "model_max_length": 8192}
    return {"tokenizer.json": json.dumps(doc, separators=(",", ":")).encode(),
            "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode()}


def _model_card(repo_id: str, spec: dict, source: str) -> bytes:
    return (f"---\nlibrary_name: transformers\npipeline_tag: text-generation\n---\n\n"
            f"# {repo_id} (gpuserve lab Hub stand-in)\n\n{spec.get('purpose', '').strip()}\n\n"
            f"Composed by tools/compose_checkpoint.py from {source}: real safetensors headers,\n"
            "no trained weights (COMPOSED.md). Served only by the lab's Hub stand-in.\n").encode()


def _inputs(name: str, spec: dict, cat: dict) -> str:
    from gpuserve.memory.models import MODELS_DIR

    h = hashlib.sha256()
    for path in (_compose_tool().__file__, __file__, store.__file__):
        h.update(hashlib.sha256(Path(path).read_bytes()).digest())
    h.update(json.dumps({"name": name, "spec": spec, "created": cat.get("created")},
                        sort_keys=True).encode())
    if "record" in spec:
        h.update((MODELS_DIR / f"{spec['record']}.yaml").read_bytes())
    if "from" in spec:
        h.update(_inputs(spec["from"], cat["repos"][spec["from"]], cat).encode())
    return h.hexdigest()


def _compose_first(staging: Path, repo_id: str, spec: dict) -> str:
    tool = _compose_tool()
    config, quant, source = tool.load_record_inputs(spec["record"])
    config = {**config, **spec.get("config", {})}
    tool.compose(config, staging, quant=quant, shards=spec.get("shards", 1), source=source,
                 fill=spec.get("fill", "sparse"))
    files = {".gitattributes": store.GITATTRIBUTES.encode(),
             "README.md": _model_card(repo_id, spec, source),
             "generation_config.json": (json.dumps(
                 {"bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 1.0,
                  "top_p": 0.9}, indent=2) + "\n").encode()}
    if spec.get("tokenizer"):
        files.update(tokenizer_files(config["vocab_size"]))
    if spec.get("single_file"):  # one model.safetensors, no index (small models' layout)
        (only,) = staging.glob("model-*.safetensors")
        only.rename(staging / "model.safetensors")
        (staging / "model.safetensors.index.json").unlink()
    for rel, data in files.items():
        (staging / rel).write_bytes(data)
    return source


def _break(tree: Path, breakage: str) -> None:
    """Turn a linked copy of a good checkpoint into one the product must refuse."""
    shards = sorted(tree.glob("model-*.safetensors"))
    if breakage == "no-safetensors":
        for p in [*shards, tree / "model.safetensors.index.json"]:
            p.unlink()
    elif breakage == "missing-shard":
        shards[-1].unlink()
    elif breakage == "truncated-header":
        victim = shards[min(1, len(shards) - 1)]
        with victim.open("rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            head = f.read(n // 2)
        victim.unlink()  # a hard link to the source: write a new file, never into it
        victim.write_bytes(struct.pack("<Q", n) + head)
    else:
        raise ValueError(f"lab/hub/repos.yaml: breakage {breakage!r}")


def _config_summary(tree: Path) -> dict:
    cfg = tree / "config.json"
    if not cfg.is_file():
        return {}
    data = json.loads(cfg.read_text())
    return {k: data[k] for k in ("architectures", "model_type") if k in data}


def build_repo(root: Path, repo_id: str, cat: dict) -> bool:
    """Compose ``repo_id`` under ``root`` unless its inputs are unchanged; True when built."""
    spec = cat["repos"][repo_id]
    digest = _inputs(repo_id, spec, cat)
    repo_dir = root / repo_id
    meta_path = repo_dir / "repo.json"
    if meta_path.is_file() and json.loads(meta_path.read_text()).get("inputs") == digest:
        return False
    if "from" in spec:
        build_repo(root, spec["from"], cat)
    final, repo_dir = repo_dir, root / ".build" / repo_id  # built aside, swapped in whole
    if repo_dir.exists():
        shutil.rmtree(repo_dir)
    repo_dir.mkdir(parents=True)
    staging = repo_dir / ".staging"
    if "from" in spec:
        src = store.Repo(root, spec["from"])
        store.link_tree(src.dir / "commits" / src.commit_ids()[0], staging)
        if "breakage" in spec:
            _break(staging, spec["breakage"])
        base_spec = cat["repos"][spec["from"]]
    else:
        _compose_first(staging, repo_id, spec)
        base_spec = spec
    date = spec.get("date") or base_spec.get("date") or cat["created"]
    config = _config_summary(staging)
    first = store.write_commit(repo_dir, staging, title="Upload composed checkpoint",
                               date=date, parent=None)
    commits = [{"id": first, "parent": None, "title": "Upload composed checkpoint",
                "date": date}]
    parent = first
    for later in spec.get("later", []):
        staging = repo_dir / ".staging"
        store.link_tree(repo_dir / "commits" / parent, staging)
        for rel, doc in later.get("json", {}).items():
            (staging / rel).unlink(missing_ok=True)
            (staging / rel).write_text(json.dumps(doc, indent=2) + "\n")
        cid = store.write_commit(repo_dir, staging, title=later["title"], date=later["date"],
                                 parent=parent)
        commits.append({"id": cid, "parent": parent, "title": later["title"],
                        "date": later["date"]})
        parent = cid
    meta = {"id": repo_id, "inputs": digest, "purpose": " ".join(spec["purpose"].split()),
            "access": spec.get("access", "public"), "created": cat["created"],
            "branches": {"main": first}, "commits": commits, "config": config,
            "tags": ["safetensors", "gpuserve-lab", "composed"]}
    if spec.get("token"):
        meta["token_sha256"] = store.token_digest(spec["token"])
    store.write_repo_json(repo_dir, meta)
    # a server answering meanwhile sees the old repository or the new one, never half
    old = root / ".build" / f"{repo_id}.old"
    if final.exists():
        final.rename(old)
    final.parent.mkdir(parents=True, exist_ok=True)
    repo_dir.rename(final)
    if old.exists():
        shutil.rmtree(old)
    return True


def publish(mirror_root: Path, names: list[str] | None = None) -> list[str]:
    """Compose every catalog repository (or ``names``) into ``mirror_root/hub``; returns
    those rebuilt now. Repositories no longer in the catalog are removed."""
    root = hub_root(mirror_root)
    root.mkdir(parents=True, exist_ok=True)
    cat = catalog()
    built = [name for name in (names or list(cat["repos"])) if build_repo(root, name, cat)]
    if names is None:
        for gone in set(store.list_repos(root)) - set(cat["repos"]):
            shutil.rmtree(root / gone)
    return built
