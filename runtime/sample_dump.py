"""The real English Wikipedia sample, fetched from the gensim 4.3.3 wheel on PyPI.

No data hub is needed: PyPI is reachable wherever pip works, and this wheel
carries a genuine ``pages-articles`` export (206 pages, export-0.10 schema).
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from rag_core.errors import WikiragError

SAMPLE_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
SAMPLE_MEMBER = f"gensim/test/test_data/{SAMPLE_NAME}"
SAMPLE_SHA256 = "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d"
WHEEL = "gensim==4.3.3"

log = logging.getLogger("wikirag.sample")


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fetch_sample(data_dir: Path) -> Path:
    """Path of the verified sample dump in ``data_dir``, downloading it once."""
    target = data_dir / SAMPLE_NAME
    if target.exists() and _sha256(target) == SAMPLE_SHA256:
        return target
    data_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=data_dir) as tmp:
        log.info("downloading the %s wheel from PyPI for its Wikipedia sample", WHEEL)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet", WHEEL, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wheels = list(Path(tmp).glob("gensim-*.whl"))
        if proc.returncode != 0 or not wheels:
            reason = (proc.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise WikiragError(f"cannot download {WHEEL} from PyPI ({reason}); check the network or pass a dump path")
        with zipfile.ZipFile(wheels[0]) as wheel:
            try:
                data = wheel.read(SAMPLE_MEMBER)
            except KeyError:
                raise WikiragError(f"{wheels[0].name} has no {SAMPLE_MEMBER}; the wheel changed, pass a dump path") from None
        if hashlib.sha256(data).hexdigest() != SAMPLE_SHA256:
            raise WikiragError(f"{SAMPLE_MEMBER} in {wheels[0].name} fails its sha256 check; not using it")
        partial = Path(tmp) / SAMPLE_NAME
        partial.write_bytes(data)
        partial.replace(target)
    log.info("sample dump verified (sha256 %s...) at %s", SAMPLE_SHA256[:12], target)
    return target
