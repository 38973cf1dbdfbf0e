"""Who compiled which kernel cache archive, on the broker (ADR 0047): each module attests its own publication under
a key only it may write (its Redis ACL), and every module reads them all to decide whether to trust an archive of
the shared store, whose own records any module could write (:mod:`agent.kernel_cache`)."""

from __future__ import annotations

import os
from typing import Any

from celery.backends.filesystem import FilesystemBackend

from contract.kv import KV, PREFIX, _dump, _is_redis

# Who compiled which kernel cache archive (m1000-fleet:kc:<cache key digest>:<module>): written by that module only
# (its Redis ACL), read by every module deciding whether to trust an archive of the shared store
# (:mod:`agent.kernel_cache`): the store's own files can be written by any module, these cannot. Kept as long as a
# compiled cache is useful.
ATTEST = "kc"
# m1000-fleet:kcidx:<cache key digest>: the set of the modules that attested (a hint only)
ATTEST_INDEX = "kcidx"
ATTEST_TTL = 180 * 86400


def attestation_key(cache_key: str, module: str) -> str:
    """Where ``module`` says which archive it compiled for a kernel cache key (the key's digest): only ``module``
    may write it (its ACL's ``m1000-fleet:kc:*:<module>``), every module may read it."""
    return f"{PREFIX}:{ATTEST}:{cache_key}:{module}"



class Attestations:
    """The attestations of a broker (:class:`contract.kv.KV`): the agent's kernel cache ledger."""

    def __init__(self, kv: KV) -> None:
        self.kv = kv

    def put_attestation(self, cache_key: str, module: str, record: dict[str, Any]) -> None:
        """``module``'s record for ``cache_key``, and (Redis) its name in the key's index, which every module may
        write: an index entry only says where to look, the record under the module's own key is what counts."""
        key = attestation_key(cache_key, module)
        if not _is_redis(self.kv.backend):
            self.kv.put(key, record, ex=ATTEST_TTL)
            return
        idx = f"{PREFIX}:{ATTEST_INDEX}:{cache_key}"
        pipe = self.kv.backend.client.pipeline(transaction=False)
        pipe.set(key, _dump(record), ex=ATTEST_TTL)
        pipe.sadd(idx, module)
        pipe.expire(idx, ATTEST_TTL)
        pipe.execute()

    def attestations(self, cache_key: str) -> list[tuple[str, Any]]:
        """(module, record) of every module's attestation for ``cache_key``: the module is the key's last part, as
        the broker's ACL lets only that module write it. Redis: the modules the key's index names (SMEMBERS; a
        name planted there points at a record only that module could write) and one MGET; the embedded broker:
        its files of the records' pattern."""
        prefix = attestation_key(cache_key, "")
        if isinstance(self.kv.backend, FilesystemBackend):
            folder = os.path.dirname(os.fsdecode(self.kv.backend._filename(prefix.encode())))
            try:
                keys = sorted(n for n in os.listdir(folder) if n.startswith(prefix) and not n.endswith(".tmp"))
            except OSError:
                return []
        elif _is_redis(self.kv.backend):
            names = self.kv.backend.client.smembers(f"{PREFIX}:{ATTEST_INDEX}:{cache_key}")
            keys = sorted(prefix + (n.decode() if isinstance(n, bytes) else str(n)) for n in names)
        else:
            return []
        values = self.kv.get_many(keys) if keys else []
        return [(k[len(prefix):], v) for k, v in zip(keys, values, strict=True) if ":" not in k[len(prefix):]]
