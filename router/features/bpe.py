"""The BPE encoding the token counts use, read from the files litellm ships: nothing is downloaded.

o200k_base is preferred, cl100k_base taken when it is missing; each file is checked against
tiktoken's expected hash before use.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

import tiktoken

__all__ = ["TokenizerUnavailable", "build_encoding", "default_encoding", "find_tokenizers_dir"]


class TokenizerUnavailable(RuntimeError):
    """No usable BPE file was found (litellm not installed, or its files missing)."""


@dataclass(frozen=True)
class _EncodingSpec:
    name: str
    file: str  # litellm names the file sha1(download URL), as tiktoken's cache does
    sha256: str  # tiktoken's expected hash of the file
    pat_str: str
    special_tokens: tuple[tuple[str, int], ...]


# pat_str and special tokens copied from tiktoken_ext.openai_public (tiktoken 0.14).
_O200K = _EncodingSpec(
    name="o200k_base",
    file="fb374d419588a4632f3f557e76b4b70aebbca790",
    sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    pat_str="|".join(
        [
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
            r"""\p{N}{1,3}""",
            r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
            r"""\s*[\r\n]+""",
            r"""\s+(?!\S)""",
            r"""\s+""",
        ]
    ),
    special_tokens=(("<|endoftext|>", 199999), ("<|endofprompt|>", 200018)),
)
_CL100K = _EncodingSpec(
    name="cl100k_base",
    file="9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
    sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
    pat_str=(
        r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+"""
        r"""| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
    ),
    special_tokens=(
        ("<|endoftext|>", 100257),
        ("<|fim_prefix|>", 100258),
        ("<|fim_middle|>", 100259),
        ("<|fim_suffix|>", 100260),
        ("<|endofprompt|>", 100276),
    ),
)
_PREFERENCE = (_O200K, _CL100K)


def find_tokenizers_dir() -> Path | None:
    """litellm's bundled tokenizer directory, located without importing litellm.

    Importing litellm takes seconds and rewrites TIKTOKEN_CACHE_DIR; ``find_spec`` only
    locates the package.
    """
    try:
        spec = importlib.util.find_spec("litellm")
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / "litellm_core_utils" / "tokenizers"
        if candidate.is_dir():
            return candidate
    return None


def _parse_bpe(data: bytes) -> dict[bytes, int]:
    # Same format tiktoken.load.load_tiktoken_bpe reads. That function is not used because,
    # given a local path, it also copies the file into TIKTOKEN_CACHE_DIR -- which litellm
    # points at its own package directory -- and raises if that directory is read-only.
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def build_encoding(directory: Path | None) -> tiktoken.Encoding:
    """o200k_base from ``directory``, else cl100k_base; ``TokenizerUnavailable`` if neither."""
    problems: list[str] = []
    if directory is None:
        problems.append("litellm is not installed, so its bundled BPE files are not available")
    else:
        for spec in _PREFERENCE:
            path = directory / spec.file
            try:
                data = path.read_bytes()
            except OSError as exc:
                problems.append(f"{spec.name}: cannot read {path}: {exc.strerror or exc}")
                continue
            if hashlib.sha256(data).hexdigest() != spec.sha256:
                problems.append(f"{spec.name}: {path} does not have the expected content")
                continue
            return tiktoken.Encoding(
                name=spec.name,
                pat_str=spec.pat_str,
                mergeable_ranks=_parse_bpe(data),
                special_tokens=dict(spec.special_tokens),
            )
    raise TokenizerUnavailable("no offline tokenizer for prompt-token estimates: " + "; ".join(problems))


@functools.cache
def default_encoding() -> tiktoken.Encoding:
    """The process-wide encoding (immutable, so sharing it is safe); built on first use."""
    return build_encoding(find_tokenizers_dir())
