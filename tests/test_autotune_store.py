"""The autotune store: keys and buckets, file round trip, nearest lookup, stale and unusable files,
atomic locked writes under concurrent writers."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import warnings

import filelock
import pytest
import torch
import triton

from vase_triton.autotune import lookup, shapes, store
from vase_triton.autotune.device import DeviceProfile
from vase_triton.autotune.model_shapes import AttentionLayout, tuning_launches
from vase_triton.autotune.shapes import DecodeShape
from vase_triton.autotune.spaces import SPACES

PROFILE = DeviceProfile("NVIDIA Test GPU", 100, (9, 0), 227 * 1024)
HASH = SPACES["decode"].source_hash()  # the running source: its keys are checked against its fields


def decode_key(batch: int, capacity: int) -> str:
    return f"B={batch},C={capacity},H=32/8,D=128,dtype=bfloat16,scores=0"


KEY = decode_key(16, 4096)


def make_entry(block_n: int, ms: float) -> store.Entry:
    params = dict(block_n=block_n, num_warps=4, num_stages=3, num_splits=2)
    default = dict(block_n=64, num_warps=4, num_stages=3, num_splits=2)
    return store.Entry(
        store.Timing(params, ms), store.Timing(default, 2 * ms), store.Timing(default, 2 * ms), 12, 1,
        {"batch": 16},
    )  # fmt: skip


def write_entries(directory, entries: dict[str, store.Entry], source_hash: str = HASH, profile=PROFILE) -> None:
    def change(document):
        for key, entry in entries.items():
            store.put_entry(document, "decode", source_hash, key, entry)

    store.StoreFile(directory, profile).update(change)


@pytest.mark.parametrize(
    "size, expected", [(0, 0), (1, 1), (2, 2), (3, 4), (5, 4), (6, 8), (64, 64), (4160, 4096), (6000, 8192)]
)
def test_bucket_is_the_nearest_power_of_two_in_log_space(size, expected):
    assert shapes.bucket(size) == expected


def test_keys_bucket_sizes_and_keep_layout_dtype_and_flags():
    key = DecodeShape(13, 32, 8, 4160, 128, "bfloat16", False).key()
    assert key == "B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0"
    assert DecodeShape(16, 32, 8, 4100, 128, "bfloat16", False).key() == key
    assert DecodeShape(16, 32, 4, 4160, 128, "bfloat16", False).key() != key
    assert shapes.parse_key(key)["H"] == "32/8"


def test_key_distance_counts_octaves_and_refuses_other_layouts():
    wanted = shapes.parse_key("B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0")
    assert shapes.key_distance(wanted, shapes.parse_key("B=4,C=8192,H=32/8,D=128,dtype=bfloat16,scores=0")) == 3
    for other in ("B=16,C=4096,H=32/4,D=128,dtype=bfloat16,scores=0", "B=16,C=4096,H=32/8,D=128,dtype=float16,scores=0"):
        assert shapes.key_distance(wanted, shapes.parse_key(other)) == float("inf")
    with pytest.raises(ValueError, match="key: expected comma-separated name=value"):
        shapes.parse_key("B=16,C")


def test_round_trip_keeps_every_field(tmp_path):
    entry = make_entry(32, 0.01)
    write_entries(tmp_path, {KEY: entry})
    document = store.StoreFile(tmp_path, PROFILE).read()
    assert document["versions"]["triton"] == triton.__version__
    assert document["versions"]["torch"] == torch.__version__
    assert store.entries(document, "decode", HASH) == {KEY: entry}
    assert store.StoreFile(tmp_path, PROFILE).path.name == f"NVIDIA_Test_GPU-100sm-triton-{triton.__version__}.json"


def decode_fields(batch: int, capacity: int) -> dict:
    return DecodeShape(batch, 32, 8, capacity, 128, "bfloat16", False)._asdict()


def test_an_entry_replaces_the_trials_of_its_key(tmp_path):
    file = store.StoreFile(tmp_path, PROFILE)
    params = dict(block_n=32, num_warps=4, num_stages=3, num_splits=2)
    key, fields = decode_key(1, 64), decode_fields(1, 64)
    file.update(lambda doc: store.put_trial(doc, "decode", HASH, key, params, {"ms": 0.5}, fields))
    assert store.trials(file.read(), "decode", HASH, key, fields) == {store.params_id(params): {"ms": 0.5}}
    file.update(lambda doc: store.put_entry(doc, "decode", HASH, key, make_entry(32, 0.5)))
    assert store.trials(file.read(), "decode", HASH, key, fields) == {}


def test_trials_are_of_one_shape_of_their_key(tmp_path):
    """Batch 5 and batch 4 share a key; a trial of one is not the other's, and a trial of the
    second shape drops the first shape's."""
    file = store.StoreFile(tmp_path, PROFILE)
    first = dict(block_n=32, num_warps=4, num_stages=3, num_splits=2)
    second = {**first, "block_n": 64}
    key, five, four = decode_key(4, 4096), decode_fields(5, 4096), decode_fields(4, 4096)
    assert DecodeShape(**five).key() == DecodeShape(**four).key() == key
    file.update(lambda doc: store.put_trial(doc, "decode", HASH, key, first, {"ms": 0.5}, five))
    assert store.trials(file.read(), "decode", HASH, key, four) == {}
    file.update(lambda doc: store.put_trial(doc, "decode", HASH, key, second, {"error": "CompilationError"}, four))
    found = store.trials(file.read(), "decode", HASH, key, four)
    assert found == {store.params_id(second): {"error": "CompilationError"}}
    assert store.trials(file.read(), "decode", HASH, key, five) == {}


def test_nearest_bucket_within_the_distance_limit(tmp_path):
    write_entries(tmp_path, {
        "B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0": make_entry(32, 0.01),
        "B=1,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0": make_entry(128, 0.01),
    })  # fmt: skip
    view = lookup.StoreView(PROFILE, tmp_path)
    exact = view.find("decode", "B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0", HASH)
    assert exact.entry.winner.params["block_n"] == 32 and exact.origin == "user"
    near = view.find("decode", "B=32,C=2048,H=32/8,D=128,dtype=bfloat16,scores=0", HASH)
    assert near.key == "B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0"
    assert view.find("decode", "B=2,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0", HASH).entry.winner.params["block_n"] == 128
    assert view.find("decode", "B=16,C=65536,H=32/8,D=128,dtype=bfloat16,scores=0", HASH) is None
    assert view.find("decode", "B=16,C=4096,H=32/8,D=128,dtype=float16,scores=0", HASH) is None


def test_user_entries_take_precedence_over_packaged_ones(tmp_path, monkeypatch):
    packaged, user = tmp_path / "packaged", tmp_path / "user"
    key = "B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0"
    other = "B=1,C=256,H=32/8,D=128,dtype=bfloat16,scores=0"
    write_entries(packaged, {key: make_entry(32, 0.01), other: make_entry(64, 0.02)})
    write_entries(user, {key: make_entry(128, 0.01)})
    monkeypatch.setattr(lookup.settings, "PACKAGED_DIRECTORY", packaged)
    view = lookup.StoreView(PROFILE, user)
    assert view.find("decode", key, HASH).entry.winner.params["block_n"] == 128
    assert view.find("decode", key, HASH).origin == "user"
    assert view.find("decode", other, HASH).origin == "packaged"


def test_stale_kernel_source_is_ignored_with_one_warning(tmp_path):
    key = "B=16,C=4096,H=32/8,D=128,dtype=bfloat16,scores=0"
    write_entries(tmp_path, {key: make_entry(32, 0.01)}, source_hash="feedfacefeedface")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert lookup.StoreView(PROFILE, tmp_path).find("decode", key, HASH) is None
    assert len(caught) == 1 and "another version of its kernel source" in str(caught[0].message)
    # Writing for the current source replaces the stale section.
    write_entries(tmp_path, {decode_key(1, 64): make_entry(64, 0.02)})
    document = store.StoreFile(tmp_path, PROFILE).read()
    assert list(store.entries(document, "decode", HASH)) == [decode_key(1, 64)]


def test_a_stale_section_with_keys_of_another_format_leaves_the_other_kernels_usable(tmp_path):
    """A section tuned for another source of its kernel is never read, so keys in the fields that
    source used (here `decode` without `scores=`) do not make the file unusable."""
    write_entries(tmp_path, {"B=16,C=4096,H=32/8,D=128,dtype=bfloat16": make_entry(32, 0.01)}, source_hash="feedfacefeedface")
    append_hash = SPACES["append"].source_hash()
    append_key, params = "B=2,T=1,H=2,D=64,dtype=float32", dict(block_h=2, block_t=1, num_warps=1)
    entry = store.Entry(store.Timing(params, 0.01), None, None, 1, 0, {})
    store.StoreFile(tmp_path, PROFILE).update(lambda doc: store.put_entry(doc, "append", append_hash, append_key, entry))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        document = store.StoreFile(tmp_path, PROFILE).read()
    assert store.entries(document, "append", append_hash) == {append_key: entry}
    assert store.entries(document, "decode", HASH) == {}


def _valid_text(directory) -> str:
    write_entries(directory, {KEY: make_entry(32, 0.01)})
    return store.StoreFile(directory, PROFILE).path.read_text()


UNUSABLE = {
    "corrupt": lambda text: "{not json" + text,
    "truncated": lambda text: text[: len(text) // 2],
    "empty": lambda text: "",
    "foreign-schema": lambda text: json.dumps({**json.loads(text), "schema": 99}),
    "foreign-triton": lambda text: json.dumps({**json.loads(text), "versions": {"triton": "0.0.1"}}),
    "foreign-device": lambda text: json.dumps({**json.loads(text), "device": {"name": "other", "multiprocessors": 7}}),
    "bad-entry": lambda text: text.replace('"ms": 0.01', '"ms": "fast"'),
    "time-beyond-floats": lambda text: text.replace('"ms": 0.01', '"ms": 1' + "0" * 400),
    "infinite-time": lambda text: text.replace('"ms": 0.01', '"ms": Infinity'),
    "not-an-object": lambda text: "[1, 2]",
    "unparseable-key": lambda text: text.replace(KEY, "garbage"),
    "empty-size": lambda text: text.replace(KEY, KEY.replace("B=16", "B=")),
    "non-integer-size": lambda text: text.replace(KEY, KEY.replace("B=16", "B=abc")),
    "non-integer-heads": lambda text: text.replace(KEY, KEY.replace("H=32/8", "H=32/x")),
    "non-flag": lambda text: text.replace(KEY, KEY.replace("scores=0", "scores=yes")),
    "another-kernels-fields": lambda text: text.replace(KEY, "B=16,N=4096,H=8"),
    "missing-field": lambda text: text.replace(KEY, "B=16,C=4096"),
    "repeated-field": lambda text: text.replace(KEY, KEY.replace("C=4096", "B=4096")),
    "unparseable-trial-key": lambda text: _with_trials_of(text, "garbage"),
    "not-utf8": lambda text: text.replace('"schema"', '"sch\xe9ma"'),  # written as Latin-1
    "nested-too-deep": lambda text: "[" * 100_000 + "]" * 100_000,
}


def _with_trials_of(text: str, key: str) -> str:
    document = json.loads(text)
    document["kernels"]["decode"]["trials"][key] = {}
    return json.dumps(document)


@pytest.mark.parametrize("damage", list(UNUSABLE), ids=list(UNUSABLE))
def test_unusable_file_is_ignored_with_one_warning(tmp_path, damage):
    path = store.StoreFile(tmp_path, PROFILE).path
    path.write_text(UNUSABLE[damage](_valid_text(tmp_path)), encoding="latin-1")
    damaged = path.read_bytes()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            view = lookup.StoreView(PROFILE, tmp_path)
            assert view.find("decode", KEY, HASH) is None
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert issubclass(caught[0].category, store.AutotuneStoreWarning)
    assert str(path) in str(caught[0].message)
    # A writer moves the file aside, unchanged, with a warning naming both, and starts over.
    with pytest.warns(store.AutotuneStoreWarning, match="moved the unusable") as moved:
        write_entries(tmp_path, {decode_key(1, 64): make_entry(64, 0.02)})
    (aside,) = tmp_path.glob(path.name + ".unusable-*")
    assert aside.read_bytes() == damaged and str(aside) in str(moved[-1].message)
    assert list(store.entries(store.StoreFile(tmp_path, PROFILE).read(), "decode", HASH)) == [decode_key(1, 64)]


def test_every_key_the_tuner_writes_passes_the_check_of_its_kernel():
    layout = AttentionLayout(32, 8, 128, "test")
    launches = [
        launch
        for policy in ("vase", "vase-dkv", "rkv", "h2o", "tova")
        for launch in tuning_launches(
            layout, batches=[1, 16], budgets=[64, 8192], prompt_lens=[100, 32768], dtypes=["bfloat16"],
            window=16, score_mode="recompute", policy=policy,
        )
    ]  # fmt: skip
    assert {kernel for kernel, _ in launches} == set(SPACES)
    for kernel, shape in launches:
        shapes.check_key(SPACES[kernel].key(shape), SPACES[kernel].key_fields)


def test_a_failed_update_leaves_the_file_and_no_temporary(tmp_path):
    text = _valid_text(tmp_path)

    def fail(document):
        document["kernels"].clear()
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError, match="interrupted"):
        store.StoreFile(tmp_path, PROFILE).update(fail)
    assert store.StoreFile(tmp_path, PROFILE).path.read_text() == text
    assert not list(tmp_path.glob("*.tmp"))


def test_a_write_keeps_the_files_permissions_and_removes_a_killed_writers_temporary(tmp_path):
    path = store.StoreFile(tmp_path, PROFILE).path
    _valid_text(tmp_path)
    path.chmod(0o644)
    orphan = path.with_name(path.name + ".deadbeef.tmp")
    orphan.write_text("{half a docu")
    write_entries(tmp_path, {decode_key(1, 64): make_entry(64, 0.02)})
    assert path.stat().st_mode & 0o777 == 0o644
    assert not orphan.exists() and not list(tmp_path.glob("*.tmp"))
    path.unlink()
    previous = os.umask(0o027)
    try:
        write_entries(tmp_path, {decode_key(1, 64): make_entry(64, 0.02)})
    finally:
        os.umask(previous)
    assert path.stat().st_mode & 0o777 == 0o640  # a new file: what the umask leaves of rw-rw-rw-


def test_clear_removes_the_file(tmp_path):
    _valid_text(tmp_path)
    file = store.StoreFile(tmp_path, PROFILE)
    assert file.clear() is True
    assert not file.path.exists() and file.read() is None
    assert file.clear() is False


def test_clearing_nothing_creates_nothing(tmp_path):
    file = store.StoreFile(tmp_path / "never" / "made", PROFILE)
    assert file.clear() is False
    assert not (tmp_path / "never").exists()


def test_clear_keeps_the_lock_that_a_waiting_writer_holds(tmp_path):
    # A writer that opened the lock file before `clear` and locks it afterwards must still
    # exclude every later writer: removing the lock file would give the later ones a new one.
    _valid_text(tmp_path)
    file = store.StoreFile(tmp_path, PROFILE)
    with open(file.lock_path, "a") as waiting:
        file.clear()
        fcntl.flock(waiting, fcntl.LOCK_EX)
        with pytest.raises(filelock.Timeout):
            filelock.FileLock(str(file.lock_path), timeout=0.1).acquire()


def _write_many(directory: str, writer: int, count: int) -> None:
    file = store.StoreFile(directory, PROFILE)
    for index in range(count):
        key = decode_key(writer, index)
        params = dict(block_n=32, num_warps=4, num_stages=3, num_splits=index + 1)
        fields = decode_fields(writer, index)
        file.update(lambda doc: store.put_trial(doc, "decode", HASH, key, params, {"ms": 1.0}, fields))
        file.update(lambda doc: store.put_entry(doc, "decode", HASH, key, make_entry(32, 0.01 * (index + 1))))


def test_concurrent_writers_leave_a_valid_file_with_every_entry(tmp_path):
    writers, count = 4, 12
    context = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    processes = [context.Process(target=_write_many, args=(str(tmp_path), w, count)) for w in range(writers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=240)
        assert process.exitcode == 0
    document = store.StoreFile(tmp_path, PROFILE).read()
    found = store.entries(document, "decode", HASH)
    assert set(found) == {decode_key(w, i) for w in range(writers) for i in range(count)}
    assert document["kernels"]["decode"]["trials"] == {}
    assert not list(tmp_path.glob("*.tmp"))
