"""A heartbeat and the module's name lease in one write (one round trip on Redis), each under its own key."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from contract.celery_app import make_app
from contract.kv import KV
from contract.records import Heartbeat
from contract.settings import BrokerSettings
from tests.support.redis_server import running_redis


@pytest.fixture(params=["embedded", pytest.param("redis", marks=[pytest.mark.slow, pytest.mark.redis])])
def kv(request: pytest.FixtureRequest, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "embedded":
        app = make_app(BrokerSettings(broker_url="filesystem://", data_dir=tmp_path))
        yield KV(app)
        app.close()
        return
    with running_redis(tmp_path_factory) as server:
        app = make_app(BrokerSettings(broker_url=server.url, data_dir=tmp_path), module="m1")
        yield KV(app)
        app.close()


def test_heartbeat_and_lease_in_one_write(kv: KV) -> None:
    hb = Heartbeat(module="m1", agent_version="t", ts=time.time())
    kv.put_heartbeat(hb, {"host": "h", "pid": 1, "created": 2.0, "ts": hb.ts})
    assert kv.heartbeats(["m1"]) == {"m1": hb}
    assert kv.lease("m1") == {"host": "h", "pid": 1, "created": 2.0, "ts": hb.ts}
    later = hb.model_copy(update={"ts": hb.ts + 5})
    kv.put_heartbeat(later)  # without a lease: the lease is left as it was
    assert kv.heartbeats(["m1"]) == {"m1": later} and kv.lease("m1") is not None

    from celery.backends.redis import RedisBackend

    if isinstance(kv.backend, RedisBackend):  # the same expiry as every other value
        assert 0 < kv.backend.client.ttl("m1000-fleet:lease:m1") <= int(kv.backend.expires)
