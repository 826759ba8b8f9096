"""Algorithm parameter models: defaults, refused values, checks against the rank count, and the
old spelling ``sync_period`` of WAGMA-SGD's and eager-SGD's ``period``."""

from __future__ import annotations

import pydantic
import pytest

from harness.algorithms.params import EagerSGDParams, ParamError, RenamedParameterWarning, WAGMAParams
from harness.algorithms.registry import names, params_model, resolve_algorithm_params
from harness.schedules import is_sync_round

# The DiLoCo family's inner optimizer: AdamW with torch's defaults, unless the entry gives one.
ADAMW = {"name": "adamw", "lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.01, "amsgrad": False}
DEFAULTS = {
    "allreduce_sgd": {},
    "local_sgd": {"period": 2},
    "overlap_local_sgd": {"period": 2, "alpha": 0.6, "beta": 0.7},
    "easgd": {"period": 2, "alpha": 0.2, "overlap": False},
    "cocod_sgd": {"period": 2},
    "bmuf": {"period": 2, "block_momentum": 0.7, "block_lr": 1.0},
    "sgp": {"peers": 1, "graph": "exponential"},
    "osgp": {"peers": 1, "graph": "exponential", "synch_freq": 0},
    "dpsgd": {"graph": "ring"},
    "adpsgd": {},
    "wagma": {"group_size": 8, "period": 11},
    "eager_sgd": {"mode": "solo", "period": 33},
    "diloco": {"optimizer": ADAMW, "outer_lr": 0.7, "outer_momentum": 0.9, "inner_steps": 500},
    "streaming_diloco": {"optimizer": ADAMW, "outer_lr": 0.7, "outer_momentum": 0.9, "inner_steps": 100,
                         "fragments": 2, "overlap": 1, "alpha": 0.5, "precision": "float32"},
    "quorum_diloco": {"optimizer": ADAMW, "outer_lr": 0.7, "outer_momentum": 0.5, "inner_steps": 500,
                      "quorum": 0.5},
    "slowmo": {"base": "local_sgd", "period": 48, "slow_momentum": 0.5, "slow_lr": 1.0},
    "gossip_pga": {"graph": "ring", "period": 4},
}


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_defaults(name: str) -> None:
    assert resolve_algorithm_params(name, {}, ranks=8) == DEFAULTS[name]


def test_registry_covers_every_algorithm_with_a_documented_model() -> None:
    assert set(names()) == set(DEFAULTS)
    for name in names():
        cls = params_model(name)
        assert cls.__doc__ and cls.__doc__.strip(), name
        assert cls().name == name


def test_models_are_frozen() -> None:
    params = WAGMAParams(group_size=4)
    with pytest.raises(pydantic.ValidationError):
        params.group_size = 2  # type: ignore[misc]


def test_given_values_are_kept() -> None:
    resolved = resolve_algorithm_params("overlap_local_sgd", {"period": 4, "alpha": 0.5}, ranks=16)
    assert resolved == {"period": 4, "alpha": 0.5, "beta": 0.7}


def test_unknown_algorithm_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown algorithm") as info:
        resolve_algorithm_params("hogwild", {}, ranks=4)
    message = str(info.value)
    assert "'hogwild'" in message
    assert all(name in message for name in DEFAULTS)


@pytest.mark.parametrize(
    ("name", "raw", "field", "value"),
    [
        ("local_sgd", {"perid": 4}, "perid", "'perid'"),
        ("local_sgd", {"period": 0}, "period", "0"),
        ("local_sgd", {"period": "4"}, "period", "'4'"),
        ("local_sgd", {"period": True}, "period", "True"),
        ("overlap_local_sgd", {"alpha": 0.0}, "alpha", "0.0"),
        ("overlap_local_sgd", {"beta": 1.0}, "beta", "1.0"),
        ("easgd", {"overlap": 1}, "overlap", "1"),
        ("bmuf", {"block_lr": -1.0}, "block_lr", "-1.0"),
        ("eager_sgd", {"mode": "all"}, "mode", "'all'"),
        ("dpsgd", {"graph": "torus"}, "graph", "'torus'"),
        ("osgp", {"synch_freq": -1}, "synch_freq", "-1"),
        ("wagma", {"group_size": 0}, "group_size", "0"),
    ],
)
def test_bad_params_name_the_param_and_value(name: str, raw: dict, field: str, value: str) -> None:
    with pytest.raises(ParamError) as info:
        resolve_algorithm_params(name, raw, ranks=8)
    assert info.value.path == (field,)
    assert str(info.value).startswith(f"{field}: ")
    assert f"(got {value})" in str(info.value)


def test_unknown_param_lists_the_valid_ones() -> None:
    with pytest.raises(ParamError, match=r"unknown key \(valid: name, period, alpha, beta, optimizer\)"):
        resolve_algorithm_params("overlap_local_sgd", {"tau": 2}, ranks=4)


def test_param_error_is_a_value_error() -> None:
    assert issubclass(ParamError, ValueError)


@pytest.mark.parametrize(
    ("name", "raw", "ranks", "match"),
    [
        ("wagma", {"group_size": 16}, 8, r"group_size: must be <= ranks \(8\) \(got 16\)"),
        ("wagma", {}, 4, r"group_size: must be <= ranks \(4\) \(got 8, the default\)"),
        ("wagma", {"group_size": 1}, 4, r"group_size: must be >= 2 when ranks > 1 \(got 1\)"),
        ("sgp", {"peers": 4}, 4, r"peers: must be <= ranks - 1 \(3\), .* \(got 4\)"),
        ("osgp", {"peers": 8}, 8, r"peers: must be <= ranks - 1 \(7\)"),
        ("adpsgd", {}, 5, r"adpsgd needs an even number of ranks \(ranks is 5\)"),
        ("dpsgd", {"graph": "bipartite_exponential"}, 3, r"needs an even number of ranks"),
    ],
)
def test_cross_checks_with_ranks(name: str, raw: dict, ranks: int, match: str) -> None:
    with pytest.raises(ParamError, match=match):
        resolve_algorithm_params(name, raw, ranks=ranks)


@pytest.mark.parametrize(
    ("name", "raw", "ranks"),
    [
        ("wagma", {"group_size": 1}, 1),
        ("wagma", {"group_size": 3}, 6),  # not a power of the group size: the schedule handles it
        ("sgp", {"peers": 1}, 1),
        ("sgp", {"peers": 3}, 8),
        ("adpsgd", {}, 1),
        ("dpsgd", {"graph": "ring"}, 3),
    ],
)
def test_cross_checks_accept_edge_cases(name: str, raw: dict, ranks: int) -> None:
    resolve_algorithm_params(name, raw, ranks=ranks)


def test_easgd_alpha_must_keep_the_center_stable():
    assert resolve_algorithm_params("easgd", {}, 8)["alpha"] == 0.2
    with pytest.raises(ParamError, match=r"alpha: must be < 2 / \(ranks \+ 1\)"):
        resolve_algorithm_params("easgd", {}, 10)
    assert resolve_algorithm_params("easgd", {"alpha": 0.09}, 10)["alpha"] == 0.09


# -- sync_period, the old spelling of period ------------------------------------------------------

@pytest.mark.parametrize(
    ("model", "old", "period"), [(WAGMAParams, 10, 11), (WAGMAParams, 0, 1), (EagerSGDParams, 33, 33)]
)
def test_old_sync_period_reads_as_period_with_a_warning(model, old: int, period: int) -> None:
    name = model().name
    with pytest.warns(RenamedParameterWarning, match=rf"{name}: sync_period: {old} is the old spelling of "
                                                      rf"period: {period} .* write period: {period}"):
        params = model.model_validate({"name": name, "sync_period": old})
    assert params.period == period and "sync_period" not in params.model_dump()


def test_old_and_new_spelling_give_the_same_synchronous_rounds() -> None:
    # WAGMA's sync_period S was S group rounds between global ones (sync_every S + 1); eager-SGD's
    # sync_period was its sync_every already.
    for model, old, sync_every in [(WAGMAParams, 3, 4), (EagerSGDParams, 3, 3)]:
        with pytest.warns(RenamedParameterWarning):
            period = model.model_validate({"sync_period": old}).period
        old_rounds = [t for t in range(12) if t % sync_every == sync_every - 1]
        assert [t for t in range(12) if is_sync_round(t, period)] == old_rounds


@pytest.mark.parametrize(
    ("name", "raw", "match"),
    [
        ("wagma", {"sync_period": 10, "period": 11}, r"^sync_period: give period only \(sync_period is its old"),
        ("eager_sgd", {"period": 5, "sync_period": 5}, r"^sync_period: give period only"),
        ("wagma", {"sync_period": -1}, r"^sync_period: must be an integer >= 0 \(got -1\)"),
        ("eager_sgd", {"sync_period": 0}, r"^sync_period: must be an integer >= 1 \(got 0\)"),
        ("wagma", {"sync_period": True}, r"^sync_period: must be an integer >= 0 \(got True\)"),
        ("eager_sgd", {"sync_period": "33"}, r"^sync_period: must be an integer >= 1 \(got '33'\)"),
        ("wagma", {"period": 0}, r"^period: .* \(got 0\)"),
    ],
)
def test_bad_sync_period_names_the_field(name: str, raw: dict, match: str) -> None:
    with pytest.raises(ParamError, match=match):
        resolve_algorithm_params(name, raw, ranks=8)


def test_sync_period_is_not_a_parameter_of_other_algorithms() -> None:
    with pytest.raises(ParamError, match=r"^sync_period: unknown key \(valid: name, period, optimizer\)"):
        resolve_algorithm_params("local_sgd", {"sync_period": 2}, ranks=4)


def test_an_entry_optimizer_replaces_the_scenarios_and_null_means_the_scenarios() -> None:
    assert resolve_algorithm_params("local_sgd", {"optimizer": "adam"}, ranks=4)["optimizer"]["name"] == "adam"
    assert resolve_algorithm_params("diloco", {"optimizer": None}, ranks=4)["optimizer"] is None
    assert resolve_algorithm_params("diloco", {"optimizer": {"lr": 0.1}}, ranks=4)["optimizer"]["name"] == "sgd"
    with pytest.raises(ParamError, match=r"optimizer.name: unknown optimizer"):
        resolve_algorithm_params("diloco", {"optimizer": "lamb"}, ranks=4)


@pytest.mark.parametrize("name, raw, message", [
    ("streaming_diloco", {"inner_steps": 4, "fragments": 5}, r"^fragments: must be <= inner_steps \(4\)"),
    ("streaming_diloco", {"inner_steps": 4, "overlap": 4}, r"^overlap: must be < inner_steps \(4\)"),
    ("streaming_diloco", {"alpha": 1.0}, r"^alpha: "),
    ("streaming_diloco", {"precision": "e3m0"}, r"^precision: "),
    ("quorum_diloco", {"quorum": 0}, r"^quorum: "),
    ("quorum_diloco", {"quorum": 1.5}, r"^quorum: "),
    ("slowmo", {"base": "dpsgd"}, r"^base: "),
    ("slowmo", {"slow_momentum": 1.0}, r"^slow_momentum: "),
    ("gossip_pga", {"graph": "bipartite_exponential"}, r"even number of ranks \(ranks is 5\)"),
    ("diloco", {"inner_steps": 0}, r"^inner_steps: "),
])
def test_low_communication_family_refuses_what_cannot_work(name, raw, message) -> None:
    with pytest.raises(ParamError, match=message):
        resolve_algorithm_params(name, raw, ranks=5)


def test_quorum_ranks_round_up_and_stay_in_range() -> None:
    model = params_model("quorum_diloco")
    assert [model(quorum=q).quorum_ranks(8) for q in (0.01, 0.5, 0.51, 1.0)] == [1, 4, 5, 8]
    assert model(quorum=0.5).quorum_ranks(5) == 3
