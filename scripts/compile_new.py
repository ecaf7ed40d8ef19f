"""Byte-compile the files of every distribution installed since `before` (a file of name==version
lines), on every core. These machines set PYTHONDONTWRITEBYTECODE=1, so what is not compiled at
install is compiled again by every process that imports it; uv installs without compiling, and
compiling all of site-packages to catch the new files costs 13 s of checks a call.

    python compile_new.py BEFORE          # BEFORE: written by `python compile_new.py --list`
"""

import compileall
import importlib.metadata as metadata
import sys
from concurrent.futures import ProcessPoolExecutor


def label(dist: metadata.Distribution) -> str:
    return f"{dist.metadata['Name']}=={dist.version}"


def compile_file(path: str) -> bool:
    return bool(compileall.compile_file(path, quiet=2))  # a file that never compiles is left as it is


def main() -> None:
    if sys.argv[1] == "--list":
        print("\n".join(sorted({label(d) for d in metadata.distributions()})))
        return
    with open(sys.argv[1]) as f:
        before = set(f.read().split())
    new = [d for d in metadata.distributions() if label(d) not in before]
    files = [str(f.locate()) for d in new for f in d.files or [] if f.suffix == ".py"]
    with ProcessPoolExecutor() as pool:
        list(pool.map(compile_file, files, chunksize=64))


if __name__ == "__main__":
    main()
