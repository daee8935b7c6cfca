"""Effects from Python: effect functions and reconcile hooks run by the
runner's effects loop, their answers as the intents' states."""

import threading
import time

import pytest

import ordo
from conftest import place


def record(name):
    def handler(tx, event):
        tx.execute("INSERT INTO shipments VALUES (?, ?)", (event.flow_id, event.payload["total"]))
        tx.effect(name, {"order": event.flow_id, "total": event.payload["total"]})

    return handler


def settle(consumer, count, states=("succeeded", "failed", "outcome_unknown"), timeout=20.0):
    """The intents once `count` of them are in one of `states`."""
    deadline = time.monotonic() + timeout
    while True:
        effects = consumer.effects()
        if sum(e["state"] in states for e in effects) >= count:
            return effects
        assert time.monotonic() < deadline, effects
        time.sleep(0.02)


def run_effects(orders, shipping, functions, count=1, states=("succeeded", "failed", "outcome_unknown"), **kwargs):
    for i in range(count):
        place(orders, f"o-{i + 1}", 10 * (i + 1))
    ordo.relay(orders, shipping)
    shipping.apply(record(next(iter(functions))))
    with ordo.Runner() as runner:
        runner.effects(shipping, functions, **kwargs)
        effects = settle(shipping, count, states)
        report = runner.stop()
    return effects, report


def test_an_effect_function_is_called_with_the_intent_and_its_dict_is_the_result(orders, shipping):
    seen = []

    def notify(effect):
        seen.append((effect, threading.get_ident()))
        return {"sent_to": effect.request["order"], "attempt": effect.attempt}

    effects, report = run_effects(orders, shipping, {"notify": notify}, count=2)
    assert [e["state"] for e in effects] == ["succeeded", "succeeded"]
    assert effects[0]["result"] == {"sent_to": "o-1", "attempt": 1}
    assert effects[0]["attempts"] == 1
    effect, thread = seen[0]
    assert isinstance(effect, ordo.Effect)
    assert effect.key == effects[0]["key"]
    assert effect.name == "notify"
    assert effect.request == {"order": "o-1", "total": 10}
    assert (effect.producer, effect.flow_id, effect.seq) == ("orders", "o-1", 1)
    assert thread != threading.get_ident(), "it runs on the effects loop's thread"
    assert report.effects["succeeded"] == 2
    assert report.effects["attempted"] == 2
    assert shipping.status()["effects"]["succeeded"] == 2


def test_retry_leaves_the_intent_pending_not_before_after_s(orders, shipping):
    def notify(effect):
        raise ordo.Retry("provider busy", after_s=3600)

    place(orders, "o-1", 10)
    ordo.relay(orders, shipping)
    shipping.apply(record("notify"))
    with ordo.Runner() as runner:
        runner.effects(shipping, {"notify": notify})
        deadline = time.monotonic() + 20
        while shipping.effects()[0]["attempts"] == 0:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        report = runner.stop()
    (effect,) = shipping.effects()
    assert effect["state"] == "pending"
    assert effect["attempts"] == 1
    assert effect["last_error"] == "provider busy"
    assert effect["next_attempt_at_ms"] - effect["updated_at_ms"] >= 3_500_000
    assert report.effects["retried"] == 1


def test_retry_out_of_attempts_fails(orders, shipping):
    def notify(effect):
        raise ordo.Retry("provider busy")

    effects, _ = run_effects(
        orders, shipping, {"notify": notify}, policy={"notify": ordo.EffectPolicy(max_attempts=1)}
    )
    assert effects[0]["state"] == "failed"
    assert effects[0]["last_error"].startswith("provider busy")


def test_failed_fails_and_unknown_and_other_exceptions_are_outcome_unknown(orders, shipping):
    def notify(effect):
        if effect.flow_id == "o-1":
            raise ordo.Failed("address rejected")
        if effect.flow_id == "o-2":
            raise ordo.Unknown("connection reset after sending")
        raise KeyError("a bug")

    effects, report = run_effects(orders, shipping, {"notify": notify}, count=3)
    assert [(e["flow_id"], e["state"]) for e in effects] == [
        ("o-1", "failed"),
        ("o-2", "outcome_unknown"),
        ("o-3", "outcome_unknown"),
    ]
    assert effects[0]["last_error"] == "address rejected"
    assert effects[1]["last_error"] == "connection reset after sending"
    assert "KeyError" in effects[2]["last_error"]
    assert report.effects["failed"] == 1
    assert report.effects["unknown"] == 2


def test_reconcile_hooks_settle_unknown_outcomes(orders, shipping):
    calls = []

    def notify(effect):
        calls.append(effect.flow_id)
        if effect.attempt == 1:
            raise ordo.Unknown("timed out")
        return {"second": True}

    def find(effect):
        if effect.flow_id == "o-1":
            return {"found": effect.key}  # it happened
        if effect.flow_id == "o-2":
            raise ordo.Retry("not found")  # it did not: back to pending
        return None  # cannot tell

    effects, _ = run_effects(
        orders,
        shipping,
        {"notify": notify},
        count=3,
        states=("succeeded", "outcome_unknown"),
        reconcile={"notify": find},
        policy={"notify": ordo.EffectPolicy(max_attempts=3)},
    )
    by_flow = {e["flow_id"]: e for e in effects}
    assert by_flow["o-1"]["state"] == "succeeded"
    assert by_flow["o-1"]["result"] == {"found": by_flow["o-1"]["key"]}
    assert by_flow["o-3"]["state"] == "outcome_unknown"
    # o-2 went back to pending, then its second attempt succeeded (or it
    # is still waiting for its backoff).
    assert by_flow["o-2"]["state"] in ("pending", "succeeded")


def test_effect_policy_is_checked_when_built():
    policy = ordo.EffectPolicy(max_attempts=3, dedup_window_s=60, ordered=False)
    assert (policy.max_attempts, policy.dedup_window_s, policy.ordered) == (3, 60.0, False)
    assert (policy.timeout_s, policy.lease_s) == (10.0, 30.0)
    assert ordo.EffectPolicy().max_attempts == 8
    with pytest.raises(ordo.InvalidInput):
        ordo.EffectPolicy(max_attempts=0)
    with pytest.raises(ordo.InvalidInput):
        ordo.EffectPolicy(max_attempts=-1)
    with pytest.raises(ordo.InvalidInput):
        ordo.EffectPolicy(timeout_s=30, lease_s=31)
    with pytest.raises(ordo.InvalidInput):
        ordo.EffectPolicy(dedup_window_s=float("nan"))


def test_the_outcomes_keep_their_arguments():
    retry = ordo.Retry("busy", after_s=2.5)
    assert (retry.reason, retry.after_s, str(retry)) == ("busy", 2.5, "busy")
    assert ordo.Retry("busy").after_s is None
    assert ordo.Failed("no").reason == "no"
    assert ordo.Unknown("maybe").reason == "maybe"
    assert not issubclass(ordo.Retry, ordo.Error)
    assert issubclass(ordo.Unknown, Exception)


def test_bad_effect_arguments_are_refused_before_anything_runs(shipping):
    with ordo.Runner() as runner:
        with pytest.raises(TypeError):
            runner.effects(shipping, [print])
        with pytest.raises(TypeError):
            runner.effects(shipping, {"notify": 3})
        with pytest.raises(ordo.InvalidInput):
            runner.effects(shipping, {})
        with pytest.raises(ordo.InvalidInput):
            runner.effects(shipping, {"Bad Name": print})
        with pytest.raises(ordo.InvalidInput):
            runner.effects(shipping, {"notify": print}, reconcile={"other": print})
        with pytest.raises(TypeError):
            runner.effects(shipping, {"notify": print}, policy={"notify": {"max_attempts": 2}})
