"""Find, verify, load and write hub entries.

An entry is a folder ``<name>/`` holding ``config.json`` (the init arguments, plus a ``"zoo"`` section with the
class paths, the datamodule, the sha256 of every weight file, metrics and library versions), ``model.safetensors``
and ``README.md`` (the model card). Entries are looked up in this order:

1. the ``hub=`` argument,
2. the ``ZOO_HUB`` environment variable,
3. the entries bundled in ``zoo/pretrained/``.

``hub=`` and ``ZOO_HUB`` hold local folders or ``hf:ORG`` Hugging Face namespaces (repo ``ORG/<name>``),
separated by ``os.pathsep``. ``HF_HUB_OFFLINE=1`` is honoured by huggingface_hub: only its cache is read.
Weights are safetensors only and are verified against their checksums before they are read.

An entry is data, never code: the class built is always a registered entry's class (``zoo.registry``), chosen
before anything is imported; ``config.json`` only supplies init arguments, which must all be arguments of that
class. A folder whose config names any other class (``os.system``, a class of another installed package, a
``ZooModule`` subclass that no entry registers) is refused before any import.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from zoo.registry import ENTRIES, conf_path, get_entry, import_object

if TYPE_CHECKING:  # pragma: no cover
    from lightning import LightningDataModule, LightningModule

__all__ = [
    "ChecksumError",
    "UntrustedEntryError",
    "BUNDLED",
    "WEIGHTS",
    "locations",
    "find",
    "materialize",
    "read_config",
    "verify_checksums",
    "load_weights",
    "load",
    "entry_class",
    "check_init_args",
    "class_path",
    "create",
    "datamodule",
    "card",
    "conf_section",
    "write_entry",
    "sha256",
    "staging",
]

BUNDLED = Path(__file__).resolve().parent / "pretrained"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
CARD = "README.md"
_HF_FILES = [CONFIG, WEIGHTS, CARD]


class ChecksumError(ValueError):
    """A weight file does not match the sha256 recorded in its entry's ``config.json``."""


class UntrustedEntryError(ValueError):
    """An entry's ``config.json`` asks for a class the zoo does not register, or for arguments it does not take."""


def locations(hub: str | os.PathLike | None = None) -> list[str]:
    """The hub locations searched, in order: ``hub``, then ``ZOO_HUB``, then the bundled folder."""
    found: list[str] = []
    for source in (hub, os.environ.get("ZOO_HUB")):
        if source:
            parts = str(source).split(os.pathsep)
            # os.pathsep is ":" on POSIX, which also splits "hf:ORG": glue the namespace back on.
            while parts:
                part = parts.pop(0)
                if part == "hf" and parts:
                    part = f"hf:{parts.pop(0)}"
                if part:
                    found.append(part)
    return found + [str(BUNDLED)]


def _hf_snapshot(repo_id: str, **kwargs: Any) -> Path:
    from huggingface_hub import snapshot_download

    # Only the three files of an entry: never a pickle that happens to sit in the repo.
    return Path(snapshot_download(repo_id=repo_id, allow_patterns=_HF_FILES, **kwargs))


def find(name: str | os.PathLike, hub: str | os.PathLike | None = None) -> Path:
    """The local folder of entry ``name`` (or ``name`` itself when it is a folder).

    Raises:
        KeyError: ``name`` is neither a folder nor a zoo entry (the message lists close matches).
        FileNotFoundError: no location holds the entry; the message lists where it looked.
    """
    if Path(name).is_dir():
        return Path(name)
    name = str(name)
    get_entry(name)  # unknown names fail here, with close matches
    tried: list[str] = []
    for location in locations(hub):
        if location.startswith("hf:"):
            repo_id = f"{location[3:].strip('/')}/{name}"
            try:
                folder = _hf_snapshot(repo_id)
            except Exception as err:  # offline, missing repo, no network: try the next location
                tried.append(f"{location} ({type(err).__name__})")
                continue
            if (folder / CONFIG).is_file():
                return folder
            tried.append(f"{location} (no {CONFIG})")
        else:
            folder = Path(location).expanduser() / name
            if (folder / CONFIG).is_file():
                return folder
            tried.append(str(folder))
    raise FileNotFoundError(
        f"No hub entry for '{name}'. Looked in: {', '.join(tried)}. Publish one with `zoo publish {name}`, "
        "or point ZOO_HUB at a folder that holds it."
    )


def materialize(model_id: str | os.PathLike, **hf_kwargs: Any) -> Path:
    """A local folder for ``model_id``: the folder itself, or a snapshot of the Hugging Face repo of that id."""
    if Path(model_id).is_dir():
        return Path(model_id)
    kwargs = {k: v for k, v in hf_kwargs.items() if v is not None}
    return _hf_snapshot(str(model_id), **kwargs)


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """Read ``config.json`` of an entry folder.

    Raises:
        FileNotFoundError: the folder has no ``config.json`` (huggingface_hub would only warn).
        ValueError: ``config.json`` is not valid JSON, or has no ``"zoo"`` section with checksums.
    """
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: {folder} is not a hub entry. Entries are written by `zoo publish`."
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is corrupt ({err}). Delete the folder and re-publish the entry.") from None
    if not isinstance(config.get("zoo"), dict) or not isinstance(config["zoo"].get("sha256"), dict):
        raise ValueError(
            f"{path} records no checksums (no 'zoo.sha256' section), so its weights cannot be verified. "
            "Write entries with `zoo publish` or `zoo.hub.write_entry`."
        )
    return config


def sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verify_checksums(folder: str | os.PathLike, config: dict[str, Any]) -> None:
    """Check every weight file against the sha256 recorded in ``config["zoo"]["sha256"]``.

    Raises:
        ChecksumError: a file differs, naming the file and both digests.
        FileNotFoundError: a recorded file is missing.
    """
    folder = Path(folder)
    recorded: dict[str, str] = config["zoo"]["sha256"]
    if WEIGHTS not in recorded:
        raise ChecksumError(
            f"{folder / CONFIG} records no checksum for {WEIGHTS}; refusing to load unverified weights."
        )
    for file_name, expected in recorded.items():
        path = folder / file_name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from the hub entry. Delete the folder and re-publish.")
        actual = sha256(path)
        if actual != expected:
            raise ChecksumError(
                f"Checksum mismatch for {folder.name}/{file_name}: expected sha256 {expected[:12]}…, got "
                f"{actual[:12]}…. The file is corrupt or was changed; delete the folder and re-publish."
            )


def load_weights(
    model: "LightningModule", folder: str | os.PathLike, map_location: str = "cpu", strict: bool = True
) -> None:
    """Load ``model.safetensors`` of ``folder`` into ``model`` (never a pickle).

    Raises:
        ValueError: the file is not readable safetensors, or its tensors do not match the model.
    """
    import safetensors.torch
    from safetensors import SafetensorError

    path = Path(folder) / WEIGHTS
    try:
        safetensors.torch.load_model(model, str(path), strict=strict, device=map_location)
    except SafetensorError as err:
        raise ValueError(
            f"{path} is not a readable safetensors file ({err}). Delete the folder and re-publish."
        ) from None
    except RuntimeError as err:
        raise ValueError(
            f"The weights in {path} do not fit {type(model).__name__} built from its config.json: {err}. "
            "Were init arguments overridden that change parameter shapes?"
        ) from None


def _registered(path: str) -> str | None:
    """The registered class path that ``path`` names: itself, or its defining file's form.

    ``zoo.models.ra_sae.module.RASAE`` names the registered ``zoo.models.ra_sae.RASAE``: same class name, and the
    registered package is the start of the module path. Decided on strings alone, so nothing is imported.
    """
    for registered in sorted({e.module for e in ENTRIES}):
        package, _, cls_name = registered.rpartition(".")
        module, _, name = path.rpartition(".")
        if path == registered or (name == cls_name and module.startswith(f"{package}.")):
            return registered
    return None


def class_path(cls: type) -> str:
    """The path recorded in an entry for ``cls``: the registered one where a registered entry builds ``cls``."""
    own = f"{cls.__module__}.{cls.__qualname__}"
    registered = _registered(own)
    return registered if registered is not None and import_object(registered) is cls else own


def entry_class(config: dict[str, Any], folder: str | os.PathLike, name: str | None = None) -> type:
    """The class to build for an entry: the registry's, never one the entry names on its own.

    ``name`` (a registered entry) fixes the class; a folder loaded by path must name a registered entry's class.
    The check runs on strings before any import; the imported class must be a ``ZooModule``.

    Raises:
        UntrustedEntryError: the config names a class no entry registers, another entry's class than ``name``'s,
            or a class that is not a ``ZooModule``.
    """
    recorded = config["zoo"].get("module")
    allowed = sorted({e.module for e in ENTRIES})
    registered = _registered(recorded) if isinstance(recorded, str) else None
    where = Path(folder) / CONFIG
    if registered is None:
        raise UntrustedEntryError(
            f"{where} names the class {recorded!r}, which no zoo entry registers; refusing to import it. A hub entry "
            f"is data: it can only hold weights for a registered class ({', '.join(allowed)})."
        )
    if name is not None and registered != get_entry(name).module:
        raise UntrustedEntryError(
            f"{where} holds a {recorded}, but entry '{name}' is a {get_entry(name).module}; refusing to load it."
        )
    from zoo.module import ZooModule

    cls = import_object(registered)  # the registry's own path: the entry's string is never imported
    if not (isinstance(cls, type) and issubclass(cls, ZooModule)):  # pragma: no cover - a registry bug
        raise UntrustedEntryError(f"the registered {registered} is not a ZooModule")
    return cls


def check_init_args(cls: type, config: dict[str, Any], folder: str | os.PathLike) -> None:
    """Refuse ``config.json`` keys that are not init arguments of ``cls`` (huggingface_hub drops them silently).

    Raises:
        UntrustedEntryError: naming the unknown keys and the arguments ``cls`` takes.
    """
    import difflib
    import inspect

    params = inspect.signature(cls.__init__).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    known = set(params) - {"self"}
    unknown = sorted(set(config) - known - {"zoo"})
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, known, 2)
            hints.append(f"{key!r} (did you mean {', '.join(map(repr, close))}?)" if close else repr(key))
        raise UntrustedEntryError(
            f"{Path(folder) / CONFIG} has keys that are not init arguments of {cls.__name__}: {', '.join(hints)}. "
            f"{cls.__name__} takes: {', '.join(sorted(known))}."
        )


def load(name: str | os.PathLike, hub: str | os.PathLike | None = None, **overrides: Any) -> "LightningModule":
    """Pretrained module of entry ``name`` (or entry folder), in eval mode. See ``zoo.load``.

    The class built is the registry's (see :func:`entry_class`); ``config.json`` supplies init arguments only.
    """
    folder = find(name, hub)
    config = read_config(folder)
    cls = entry_class(config, folder, name=None if Path(name).is_dir() else str(name))
    return cls.from_pretrained(str(folder), **overrides)


def conf_section(name: str, section: str) -> dict[str, Any]:
    """``class_path`` and ``init_args`` of ``section`` ("model" or "data") in the conf of entry ``name``."""
    import yaml

    conf = yaml.safe_load(conf_path(name).read_text(encoding="utf-8"))
    part = conf.get(section) or {}
    entry = get_entry(name)
    return {
        "class_path": part.get("class_path", entry.module if section == "model" else entry.datamodule),
        "init_args": dict(part.get("init_args") or {}),
    }


def create(name: str, **init_args: Any) -> "LightningModule":
    """A fresh module of entry ``name``: its conf's init args updated with ``init_args``."""
    section = conf_section(name, "model")
    return import_object(section["class_path"])(**{**section["init_args"], **init_args})


def datamodule(name: str, **overrides: Any) -> "LightningDataModule":
    """The DataModule of entry ``name`` as its conf sets it up, updated with ``overrides``."""
    section = conf_section(name, "data")
    return import_object(section["class_path"])(**{**section["init_args"], **overrides})


def card(name: str, hub: str | os.PathLike | None = None) -> str:
    """The model card text of entry ``name``."""
    path = find(name, hub) / CARD
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: the entry has no model card.")
    return path.read_text(encoding="utf-8")


@contextmanager
def staging(dest: Path) -> Iterator[Path]:
    """Yield a temporary sibling folder of ``dest``; on success rename it into place, on failure remove it.

    The temporary name starts with a dot and is never ``<name>``, so a reader cannot mistake a half-written
    entry for a valid one.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
    if dest.exists():
        dest.rename(old)
    tmp.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def write_entry(model: "LightningModule", dest: str | os.PathLike, *, zoo_meta: dict[str, Any], card_text: str) -> Path:
    """Write ``model`` as a hub entry at ``dest`` atomically (temporary folder, then rename).

    Args:
        model: a ``ZooModule`` (``save_pretrained`` writes ``config.json`` from its init args + safetensors).
        dest: the entry folder, e.g. ``zoo/pretrained/ra-sae``.
        zoo_meta: stored under ``config["zoo"]`` (``module`` defaults to the model's class path; ``sha256`` is
            computed here).
        card_text: the model card, written as ``README.md``.
    """
    dest = Path(dest)
    with staging(dest) as tmp:
        (tmp / CARD).write_text(card_text, encoding="utf-8")  # written first: save_pretrained keeps it
        model.save_pretrained(tmp)
        config = json.loads((tmp / CONFIG).read_text(encoding="utf-8"))
        config["zoo"] = {
            "module": class_path(type(model)),
            **zoo_meta,
            "sha256": {WEIGHTS: sha256(tmp / WEIGHTS)},
        }
        (tmp / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        for path in tmp.iterdir():
            path.chmod(0o644)  # safetensors writes 0600; a shared hub folder must be readable by its users
    return dest
