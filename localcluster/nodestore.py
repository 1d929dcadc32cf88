"""A node's image store (containerd's), kept from run to run, and the seed every store is
made from by hard links: an image is imported once per content, not once per node."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

from localcluster.network import free_slots, locked

SHARED = "shared"  # in a store made from the seed, or one the seed was made from
# The archives imported into a store (their names carry the hash of what they were built from).
# "-unpacked": stores filled before layers were discarded are imported into once more.
IMPORTED = "imported-unpacked"


def _link_copy(src: Path, dst: Path) -> None:
    """`dst` as a copy of the store `src` whose files are hard links, but for what is written
    in place (containerd's databases, our import record): those are copies of their own."""
    shutil.rmtree(dst, ignore_errors=True)
    tmp = dst.with_name(dst.name + ".part")
    shutil.rmtree(tmp, ignore_errors=True)
    res = subprocess.run(["cp", "-a", "--link", str(src), str(tmp)], capture_output=True, text=True)
    # What the runtime removes meanwhile (the leftovers of an unpack, collected just after it)
    # is skipped: its databases, copied last, no longer name it.
    errors = [e for e in res.stderr.splitlines() if "No such file or directory" not in e]
    if res.returncode != 0 and errors:
        raise RuntimeError(f"copying {src}: {'; '.join(errors)}")
    for f in [*tmp.rglob("*.db"), *tmp.glob("imported*")]:
        own = f.with_name(f.name + ".own")
        shutil.copy2(f, own)
        os.replace(own, f)
    for store in (src, tmp):
        (store / SHARED).touch()
    tmp.rename(dst)


def imported_archives(store: Path) -> set[str]:
    """The archives imported into `store` so far (none for a store not made yet)."""
    done = store / IMPORTED
    return set(done.read_text().split()) if done.exists() else set()


def _prune_idle_stores(stores: Path) -> None:
    """The stores of slots no cluster holds, once the seed has moved on (an image rebuilt):
    what only they kept is an old image (6 GB); a node of such a slot is made again from the
    seed, in seconds. Called with the seed's lock held."""
    for slot in free_slots():
        for store in stores.glob(f"etok{slot}-n*"):
            shutil.rmtree(store, ignore_errors=True)


def image_name(archive: Path) -> str:
    """The name a docker-archive gives its image (its manifest.json's first RepoTag)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None, f"{archive} has no manifest.json"
        tags = json.load(member)[0]["RepoTags"]
    return str(tags[0])


def seed_of(store: Path | None) -> Path | None:
    """The seed: one store's images shared by every store, through hard links."""
    return store.parent / "seed" if store is not None else None


def current(store: Path, images: list[Path]) -> bool:
    """Whether `store` holds every image of `images` (by the archives imported)."""
    return {archive.name for archive in images} <= imported_archives(store)


def seed_store(store: Path | None, images: list[Path]) -> None:
    """A node's store is made from the seed by hard links: an image's unpacked layers are
    files no container writes (each container writes to a layer of its own), so every
    store can share them, and a new store needs no import (two minutes and 6 GB for the
    training image, once per node of every cluster slot). A store that lacks an image the
    seed has (an image rebuilt since) is made again from the seed: it is only a cache, and
    no cluster but this node's uses it (its slot is held)."""
    seed = seed_of(store)
    if seed is None or store is None or current(store, images):
        return
    with locked(seed.with_name("seed.lock")):
        if not (seed / "root").is_dir():
            return
        if (store / SHARED).exists() and not current(seed, images):
            return  # as close to current as the seed, and shared already: import here
        shutil.rmtree(store, ignore_errors=True)
        _link_copy(seed, store)


@contextlib.contextmanager
def import_turn(store: Path | None, images: list[Path]) -> Iterator[None]:
    """While a store must import (no store is current yet: an image was rebuilt), one node
    of this machine imports at a time: the next ones find the seed current once the first
    has refreshed it, and link instead of importing the same 6 GB again."""
    seed = seed_of(store)
    if seed is None or store is None or current(store, images) or current(seed, images):
        yield
        return
    with locked(seed.with_name("import.lock")):
        yield


def refresh_seed(store: Path, store_root: Path) -> None:
    """After an import, the seed becomes a copy of this store (made while no pod ran yet),
    once the runtime has dropped the packed layers (they are not worth sharing)."""
    seed = seed_of(store)
    assert seed is not None
    blobs = store_root / "io.containerd.content.v1.content" / "blobs"

    def packed() -> int:
        return sum(f.stat().st_size for f in blobs.rglob("*") if f.is_file())

    deadline = time.monotonic() + 60
    while packed() > 50 * 2**20 and time.monotonic() < deadline:
        time.sleep(0.5)
    with locked(seed.with_name("seed.lock")):
        fresh = seed.with_name("seed.new")
        _link_copy(store, fresh)
        shutil.rmtree(seed, ignore_errors=True)
        fresh.rename(seed)
        _prune_idle_stores(seed.parent)
