"""The pure decision of :mod:`contract.eviction`: which ``INFO memory`` makes the fleet refuse its broker."""

from __future__ import annotations

import pytest

from contract.eviction import eviction_problem

EVICTING = ("allkeys-lru", "allkeys-lfu", "allkeys-random", "volatile-lru", "volatile-lfu", "volatile-random",
            "volatile-ttl")


@pytest.mark.parametrize("policy", EVICTING)
def test_a_limit_with_an_evicting_policy_is_refused_naming_the_fix(policy):
    line = eviction_problem({"maxmemory": 104857600, "maxmemory_policy": policy}, "10.0.0.5:6379")
    assert line == (f"redis at 10.0.0.5:6379: maxmemory-policy {policy} evicts keys; results would be lost — "
                    "set maxmemory-policy noeviction (redis.conf or CONFIG SET)")


def test_noeviction_is_accepted_with_or_without_a_limit():
    assert eviction_problem({"maxmemory": 104857600, "maxmemory_policy": "noeviction"}, "h:1") is None
    assert eviction_problem({"maxmemory": 0, "maxmemory_policy": "noeviction"}, "h:1") is None


@pytest.mark.parametrize("policy", EVICTING)
def test_no_limit_evicts_nothing_whatever_the_policy(policy):
    assert eviction_problem({"maxmemory": 0, "maxmemory_policy": policy}, "h:1") is None


def test_values_as_text_and_unreadable_ones():
    assert eviction_problem({"maxmemory": "1073741824", "maxmemory_policy": "allkeys-lru"}, "h:1")
    assert eviction_problem({"maxmemory": "0", "maxmemory_policy": "allkeys-lru"}, "h:1") is None
    # a limit that cannot be read: judged by the policy alone
    assert eviction_problem({"maxmemory": "lots", "maxmemory_policy": "volatile-ttl"}, "h:1")
    # a server that does not report a policy (not Redis, or very old): nothing says it evicts
    assert eviction_problem({"maxmemory": 1024}, "h:1") is None
    assert eviction_problem({}, "h:1") is None
