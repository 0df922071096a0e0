"""The tokenizer and chat template of each base model the API serves (issue 24 item 4), loaded on first use.

The configured model's comes from its local directory (`settings.base_model_path`, `Services.tokenizer`); a
catalog model's files
(tokenizer.json, tokenizer_config.json, special tokens, chat template, config.json) are fetched from the blob
store into `DATA_DIR/tokenizers/<name>/<tokenizer.json's sha256>/`, each checked against the digest the catalog
recorded, and loaded once per process (a re-added model with other files gets a new directory).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from api.caches import TtlCache
from api.prompting import BaseModelTokenizer
from registry.base_model_catalog import get_live_model
from registry.digests import sha256_file
from registry.storage import BlobStore

# the catalog files the API reads to tokenize and render chats (no weights)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
)


class TokenizerFilesError(RuntimeError):
    """A catalog model's tokenizer files are missing from the blob store or do not match their digests."""


class CatalogTokenizers:
    """Catalog base model name -> its tokenizer (None for a name that is no live catalog model)."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        blob_store: BlobStore,
        cache_dir: Path,
        ttl_s: float = 0.0,
    ) -> None:
        """`ttl_s`: how long a model's tokenizer is used without reading the catalog again (the API's
        model_cache_ttl_s: a model removed or re-added is seen within it)."""
        self.session_factory = session_factory
        self.blob_store = blob_store
        self.cache_dir = cache_dir
        self._loaded: dict[tuple[str, str], BaseModelTokenizer] = {}
        self._recent: TtlCache[str, BaseModelTokenizer] = TtlCache(ttl_s)
        self._lock = threading.Lock()

    def get(self, name: str) -> BaseModelTokenizer | None:
        """The tokenizer of catalog model `name` (blocking; on first use its files are fetched)."""
        recent = self._recent.get(name)  # the request path reads the catalog at most once per ttl_s
        if recent is not None:
            return recent
        with self.session_factory() as session:
            model = get_live_model(session, name)
            files = {f["path"]: f for f in model.files} if model is not None else {}
        if "tokenizer.json" not in files:
            return None
        key = (name, files["tokenizer.json"]["sha256"])
        with self._lock:  # one fetch per model: concurrent first requests wait for it
            if key not in self._loaded:
                self._loaded[key] = BaseModelTokenizer.load(self._fetch(key, files))
            tokenizer = self._loaded[key]
        self._recent.put(name, tokenizer)
        return tokenizer

    def _fetch(self, key: tuple[str, str], files: dict[str, dict]) -> Path:
        """The model's tokenizer files in a local directory, each verified against its recorded digest."""
        dest = self.cache_dir / key[0] / key[1]
        if (dest / "tokenizer.json").is_file():
            return dest
        partial = dest.with_name(dest.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for filename in TOKENIZER_FILES:
            record = files.get(filename)
            if record is None:
                continue
            path = partial / filename
            self.blob_store.download_to(record["blob_key"], path)
            if sha256_file(path) != record["sha256"]:
                shutil.rmtree(partial, ignore_errors=True)
                raise TokenizerFilesError(
                    f"base model {key[0]!r}: {filename} in the blob store does not match its recorded sha256; "
                    "add the model again (`lorahost models add`)"
                )
        partial.rename(dest)
        return dest
