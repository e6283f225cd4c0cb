"""The mechanisms `make mutate` mutates, each with the tests that carry its promises.

A mechanism's `files` are the only files mutmut changes; `tests` is the pytest selection run
against each mutant (mutmut narrows it further, per mutated function, to the tests that call it).
`equivalent` names the surviving mutants that no test can kill because they do not change
behaviour, each with the reason; docs/testing.md lists the same. Mutant names are mutmut's
(`module.x_function__mutmut_N`, `module.xǁClassǁmethod__mutmut_N`); a change to a function
renumbers its mutants, so after an edit an old entry can stop matching: the run then reports the
survivor as new and a person decides again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PACKAGES = ("runtime", "storage", "alerts", "monitoring", "dashboards")
MIN_KILLED_RATIO = 0.9


@dataclass(frozen=True)
class Mechanism:
    name: str
    files: tuple[str, ...]  # repository paths mutmut mutates
    tests: tuple[str, ...]  # pytest selection (paths or node ids)
    # mutant-name globs when only some functions of `files` belong to the mechanism (else all)
    only: tuple[str, ...] = ()
    equivalent: dict[str, str] = field(default_factory=dict)  # mutant name -> why it is equivalent


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism(
        "allocator",
        files=(
            "runtime/memory/allocator.py",
            "runtime/memory/ledger.py",
            "runtime/memory/block.py",
            "runtime/memory/tiers.py",
        ),
        tests=("tests/runtime/memory",),
        equivalent={
            "runtime.memory.allocator.xǁAllocatorǁalloc__mutmut_1": "always rebuilding the shape tuple: tuple() of a tuple is the same value (performance only)",
            "runtime.memory.allocator.xǁAllocatorǁalloc__mutmut_19": "`index >= 0` for `> 0`: index 0 maps to class 0 either way",
            "runtime.memory.allocator.xǁAllocatorǁalloc__mutmut_74": "skips the by_nbytes memo: queue_for returns the same class list (performance only)",
            "runtime.memory.allocator.xǁAllocatorǁalloc__mutmut_75": "as _74 (performance only)",
            "runtime.memory.tiers.xǁMediumCacheǁqueue_for__mutmut_8": "the memo stores None: the hot path falls back to queue_for, the same list (performance only)",
            "runtime.memory.allocator.xǁAllocatorǁalloc__mutmut_95": "`evictions -= put()` after a failed refit: put only re-adds the slot just taken under the same lock, the cache was within its cap before the take, so put returns 0",
            "runtime.memory.allocator.xǁAllocatorǁ_medium_hit__mutmut_14": "as alloc__mutmut_95 (the reclaim path's failed refit)",
            "runtime.memory.allocator.xǁAllocatorǁ_alloc_direct__mutmut_1": "an extra collect() right after the caller's own finds nothing new (performance only)",
            "runtime.memory.allocator.xǁAllocatorǁrelease__mutmut_3": "None for False: only its truth is read",
            "runtime.memory.allocator.xǁAllocatorǁrelease__mutmut_8": "None for False: only its truth is read",
            "runtime.memory.allocator.xǁAllocatorǁrelease__mutmut_29": "accepted, not strictly equivalent: every release takes the slow path (is_quiet + _reclaim) the hot path inlines; verdicts and counters are the same, a slot changed in place is restored at its release instead of at the next probe, so only which free slot the next alloc gets differs",
            "runtime.memory.allocator.xǁAllocatorǁrelease__mutmut_73": "LRU stamps stay strictly increasing: only their order is read",
            "runtime.memory.tiers.xǁMediumCacheǁput__mutmut_4": "LRU stamps stay strictly increasing: only their order is read",
            "runtime.memory.tiers.xǁMediumCacheǁ__init____mutmut_5": "the LRU stamp counter starts elsewhere: only the order is read",
            "runtime.memory.allocator.xǁAllocatorǁrelease__mutmut_76": "evict() at exactly the cap: its own `while cached > cap` loop evicts nothing (performance only)",
            "runtime.memory.tiers.xǁMediumCacheǁput__mutmut_8": "evict() at exactly the cap: its own loop evicts nothing (performance only)",
            "runtime.memory.tiers.xǁMediumCacheǁput__mutmut_9": "evict() always: its own loop evicts nothing under the cap (performance only)",
            "runtime.memory.tiers.x__empty_like_template__mutmut_1": "the template cache always misses: new() gives the same tensor (performance only)",
            "runtime.memory.tiers.x__empty_like_template__mutmut_2": "as _1 (performance only)",
            "runtime.memory.tiers.x__empty_like_template__mutmut_11": "a 1-element template: .new() returns an empty tensor whatever the template's size",
            "runtime.memory.tiers.x_new_direct__mutmut_3": "`reserved` is overwritten three lines later",
            "runtime.memory.tiers.x_new_direct__mutmut_9": "`reserved` is overwritten three lines later",
            "runtime.memory.tiers.x_new_medium__mutmut_4": "is_direct=None is falsy like False",
            "runtime.memory.tiers.xǁSmallSlabsǁ__init____mutmut_28": "is_direct=None is falsy like False",
            "runtime.memory.tiers.xǁSmallSlabsǁ__init____mutmut_33": "is_direct=True on slab slots: read only in _reclaim after the `home is not None` branch, which slab slots always take",
            "runtime.memory.tiers.xǁSmallSlabsǁ__init____mutmut_16": "zip strictness: both lists come from the same class list, always of equal length",
            "runtime.memory.tiers.xǁSmallSlabsǁ__init____mutmut_19": "zip strictness: as _16",
            "runtime.memory.tiers.xǁSmallSlabsǁ__init____mutmut_20": "zip strictness: as _16",
            "runtime.memory.tiers.x_fit__mutmut_11": "only the state a failed set_ leaves: an unfitted slot is never handed out or probed (the next handout refits it, eviction drops it)",
            "runtime.memory.tiers.x_fit__mutmut_12": "as _11",
            "runtime.memory.tiers.x_drop_memory__mutmut_1": "'' for None still drops the references; a dropped slot is never used again",
            "runtime.memory.tiers.x_drop_memory__mutmut_2": "as _1",
            "runtime.memory.tiers.x_is_quiet__mutmut_18": "a defensive check: after t.set_(ref), or"
            " t.data = ref when the dtype changed, t.is_set_to(ref) always holds (set_ raises"
            " otherwise), so `return True` for `return False` there is never reached",
        },
    ),
    # the paged KV cache on top of the allocator: pages, refcounts, the prefix index, preemption's
    # "no room" answer (a run of its own so each fits in a session on a 2-core machine)
    Mechanism(
        "kv",
        files=("runtime/memory/kv_pool.py", "runtime/memory/kv_cache.py"),
        tests=("tests/runtime/memory",),
        equivalent={
            "runtime.memory.kv_pool.x_page_key__mutmut_14": "array 'Q' for 'q': token ids are never"
            " negative, and for those both give the same bytes",
            "runtime.memory.kv_pool.xǁPagePoolǁ__init____mutmut_31": "_touched starts at -1: the"
            " first page ever taken is page 1 (the heap pops the lowest and nothing can be cached"
            " before a page was taken), which sets _touched to 2 either way",
            "runtime.memory.kv_pool.xǁPagePoolǁ__init____mutmut_32": "_touched starts at 2: same"
            " as _31, the first take sets it to 2",
            "runtime.memory.kv_pool.xǁPagePoolǁrelease__mutmut_11": "the LRU dict's value is never"
            " read (an ordered set): '' for None",
            "runtime.memory.kv_pool.xǁPagePoolǁtake__mutmut_23": "popitem(last=None): None is"
            " falsy like False, the oldest page is still evicted",
            "runtime.memory.kv_pool.xǁPagePoolǁtake__mutmut_31": "the zeroing index on the"
            " default device: the same on a CPU pool; only a CUDA pool tells (the cuda-marked"
            " tests/runtime/engine/test_paged_cuda.py state machine, not run here)",
            "runtime.memory.kv_pool.xǁPagePoolǁtake__mutmut_33": "as _31 (device argument dropped)",
            "runtime.memory.kv_cache.xǁKVCacheǁ__init____mutmut_43": "the pool block's own owner"
            " tag: the leak report shows the block as the cache's page rows (named by the cache's"
            " owner) from set_breakdown, right after alloc, until it is released",
            "runtime.memory.kv_cache.xǁKVCacheǁensure__mutmut_5": "`need < 0` for `<= 0`: at 0,"
            " take(0) returns [] and nothing is appended: the same True",
        },
    ),
    Mechanism(
        "batcher",
        files=("runtime/engine/batching/controller.py",),
        tests=("tests/runtime/engine/test_batch_policy.py",),
    ),
    Mechanism(
        "writer",
        files=("storage/writer.py", "storage/drain.py"),
        # the spool and the row-by-row isolation (issue 17) are the writer's too: without their
        # tests the replay and from_settings paths had no test at all in the run
        tests=(
            "tests/storage/test_writer.py",
            "tests/storage/test_outage.py",
            "tests/storage/test_spool.py",
            "tests/storage/test_isolation.py",
            "tests/storage/test_writer_edges.py",
        ),
        equivalent={
            "storage.writer.xǁInferenceLogWriterǁ__init____mutmut_4": "timing only: the default max_backoff_s 2.0 -> 3.0 changes how long retries wait",
            "storage.writer.xǁInferenceLogWriterǁ__init____mutmut_5": "timing only: the default orphan_timeout_s 60 -> 61",
            "storage.writer.xǁInferenceLogWriterǁ__init____mutmut_22": "Condition(None) makes its own lock; every counter is still written under one lock (accepted, dropped, spilled, replayed under _lock; settled and flush waiters under the condition's), nothing observable changes",
            "storage.writer.xǁInferenceLogWriterǁ__init____mutmut_36": "`_closed = None` for False: only its truth is read",
            "storage.writer.xǁInferenceLogWriterǁclose__mutmut_1": "timing only: the default close timeout 10 -> 11 s",
            "storage.writer.xǁInferenceLogWriterǁflush__mutmut_19": "timing only: `left < 0` for `<= 0`: at exactly 0 it waits 0 s and gives up on the next round",
            "storage.writer.xǁInferenceLogWriterǁflush__mutmut_25": "timing only: waits 0.05 s even when less is left (at most 50 ms late)",
            "storage.writer.xǁInferenceLogWriterǁflush__mutmut_26": "timing only: the untimed poll 0.05 -> 1.05 s; settle() notifies, so only a dead drain thread is noticed later",
            "storage.writer.xǁInferenceLogWriterǁflush__mutmut_32": "timing only: as _26 for the timed wait (never past the deadline: min(left, ...))",
            "storage.writer.xǁInferenceLogWriterǁtake__mutmut_3": "Queue.get(timeout=0) does not block, like get_nowait()",
            "storage.writer.xǁInferenceLogWriterǁtake__mutmut_5": "`block_s >= 0` sends take(0) to get(timeout=0), which does not block either",
            "storage.drain.xǁDrainerǁ__init____mutmut_15": "_deadline is read only after begin_close() has set it",
            "storage.drain.xǁDrainerǁ__init____mutmut_18": "float('INF') == float('inf')",
            "storage.drain.xǁDrainerǁ_count_retry__mutmut_13": "before_sleep runs only after a failed attempt: state.outcome is always set",
            "storage.drain.xǁDrainerǁ_sleep__mutmut_6": "timing only: once closing, a backoff sleeps at least 1 s, so the last attempt can come up to 1 s after the deadline; same outcome",
            "storage.drain.xǁDrainerǁ_sleep__mutmut_11": "timing only: the backoff is not clipped at the close deadline (up to max_backoff_s late)",
            "storage.drain.xǁDrainerǁ_write_orphans__mutmut_7": "the _write() called next drops orphan_born entries whose probe is gone anyway",
            "storage.drain.xǁDrainerǁ_write_orphans__mutmut_9": "pop(rid) without a default: rid comes from orphan_born's own keys, it never raises",
            "storage.drain.xǁDrainerǁdrop_all__mutmut_2": "timing only: the last take on the empty queue waits 1 s; nothing is queued after close",
            "storage.drain.xǁDrainerǁrun__mutmut_10": "timing only: while closing, take waits up to POLL_S on an empty queue",
            "storage.drain.xǁDrainerǁrun__mutmut_12": "timing only: while closing, the last take waits up to 1 s",
            "storage.drain.xǁDrainerǁrun__mutmut_24": "timing only: `>=` for `>` on an orphan's age",
        },
    ),
    Mechanism(
        "verification",
        files=("runtime/verify/verifier.py", "storage/audit.py"),
        # verify_jobs (the glue to the reference forward) is left to the model-backed tests of
        # tests/runtime/verify/test_verifier.py: minutes per mutant on these machines
        only=(
            "runtime.verify.verifier.xǁ*",
            "runtime.verify.verifier.x_is_sampled__mutmut_*",
            "storage.audit.x_default_threshold__mutmut_*",
            "storage.audit.x_anomaly_threshold__mutmut_*",
        ),
        tests=(
            "tests/runtime/verify/test_verifier_worker.py",
            "tests/runtime/verify/test_verifier.py::test_sampling_is_deterministic_and_near_the_rate",
            "tests/storage/test_audit.py::test_default_thresholds_loosen_with_lower_precision",
            "tests/runtime/server/test_thresholds.py",
        ),
        equivalent={
            "runtime.verify.verifier.x_is_sampled__mutmut_1": "`rate < 0` for `<= 0`: at rate 0 the hash"
            " test `h < 0` is never true either",
            "runtime.verify.verifier.x_is_sampled__mutmut_4": "`rate > 1` for `>= 1`: at rate 1 the hash"
            " test `h < 2**64` always holds (an 8-byte digest)",
            "runtime.verify.verifier.x_is_sampled__mutmut_5": "`rate >= 2` for `>= 1`: for 1 <= rate < 2"
            " the hash test always holds too",
            "runtime.verify.verifier.x_is_sampled__mutmut_16": "int.from_bytes without byteorder: 'big' is"
            " the default (Python >= 3.11)",
            "runtime.verify.verifier.x_is_sampled__mutmut_19": "`<=` for `<` against rate * 2**64: differs"
            " only for a request id whose 64-bit hash equals that number exactly",
            "runtime.verify.verifier.xǁVerifierǁsubmit_sequence__mutmut_26": "typing.cast's type argument"
            " does nothing at run time",
            "runtime.verify.verifier.xǁVerifierǁsubmit_sequence__mutmut_30": "typing.cast's type argument"
            " does nothing at run time",
            "runtime.verify.verifier.xǁVerifierǁsubmit_sequence__mutmut_31": "typing.cast's type argument"
            " does nothing at run time",
            "runtime.verify.verifier.xǁVerifierǁsubmit_sequence__mutmut_32": "typing.cast's type argument"
            " does nothing at run time",
            "runtime.verify.verifier.xǁVerifierǁ_verify__mutmut_1": "`ok = None` for `ok = False`: only its"
            " truth is read",
            "runtime.verify.verifier.xǁVerifierǁflush__mutmut_16": "`left < 0` for `left <= 0`: differs"
            " only when the clock lands exactly on the deadline; the next round returns False anyway",
            # the poll interval of flush's wait: the worker notifies on every batch, so these
            # change only how late a deadline under 50 ms away, or a dead worker, is noticed
            "runtime.verify.verifier.xǁVerifierǁflush__mutmut_22": "waits 0.05 s even when the"
            " deadline is nearer: returns False up to 50 ms late, same outcome",
            "runtime.verify.verifier.xǁVerifierǁflush__mutmut_23": "polls every 1.05 s without a"
            " timeout: a dead worker is noticed up to 1 s later (timing only; notify wakes it)",
            "runtime.verify.verifier.xǁVerifierǁflush__mutmut_29": "polls every 1.05 s with a"
            " timeout: same as _23 (timing only)",
            "runtime.verify.verifier.xǁVerifierǁclose__mutmut_1": "the default close timeout 11 s"
            " for 10 s: a bound on waiting, no test waits that long",
            "runtime.verify.verifier.xǁVerifierǁ__init____mutmut_3": "max_batch 33 for 32: a batch"
            " bound no test reaches (batching itself is pinned with max_batch=3 and 1)",
            "runtime.verify.verifier.xǁVerifierǁ__init____mutmut_26": "`_closed = None` for False:"
            " only its truth is read",
            "runtime.verify.verifier.xǁVerifierǁclose__mutmut_22": "joins the worker for at least 2 s"
            " instead of 1 s: a bound on waiting for a worker that is ending anyway",
            "runtime.verify.verifier.xǁVerifierǁclose__mutmut_6": "flush() on a worker that never"
            " started answers what `queue.empty()` does: True with nothing submitted, False else",
        },
    ),
    Mechanism(
        "alerts",
        files=("alerts/state.py",),
        tests=(
            "tests/alerts/test_state.py",
            "tests/alerts/test_evaluator.py",
            "tests/alerts/test_parity.py",
        ),
    ),
)


def by_name(name: str) -> Mechanism:
    for mechanism in MECHANISMS:
        if mechanism.name == name:
            return mechanism
    raise KeyError(f"no mechanism {name!r}; known: {', '.join(m.name for m in MECHANISMS)}")
