"""SharingMode parsing, MIG geometry and the GPU-equivalent helpers."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.domain.sharing import (
    MIG_PROFILES,
    InvalidSharingMode,
    SharingKind,
    SharingMode,
    mig_compute_slices,
    mig_gpu_eq,
    shares_for_fraction,
)

# --- SharingMode.parse -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("exclusive", SharingMode(SharingKind.EXCLUSIVE)),
        ("  exclusive  ", SharingMode(SharingKind.EXCLUSIVE)),
        ("mps:2", SharingMode(SharingKind.MPS, replicas=2)),
        ("mps:10", SharingMode(SharingKind.MPS, replicas=10)),
        ("timeslice:4", SharingMode(SharingKind.TIMESLICE, replicas=4)),
        ("mig:all-balanced", SharingMode(SharingKind.MIG, mig_layout="all-balanced")),
        ("mig:all-1g.10gb", SharingMode(SharingKind.MIG, mig_layout="all-1g.10gb")),
        ("mig:1g.10gb*2+2g.20gb+3g.40gb", SharingMode(SharingKind.MIG, mig_layout="1g.10gb*2+2g.20gb+3g.40gb")),
    ],
)
def test_parse_accepts_every_documented_form(text: str, expected: SharingMode) -> None:
    assert SharingMode.parse(text) == expected


@pytest.mark.parametrize(
    "text", ["exclusive", "mps:2", "mps:16", "timeslice:4", "mig:all-balanced", "mig:1g.10gb*2+2g.20gb+3g.40gb"]
)
def test_str_round_trips_through_parse(text: str) -> None:
    assert str(SharingMode.parse(text)) == text
    assert SharingMode.parse(str(SharingMode.parse(text))) == SharingMode.parse(text)


@pytest.mark.parametrize("kind", ["mps", "timeslice"])
@pytest.mark.parametrize("arg", ["", "1", "0", "-4", "four", "2.5", " 4"])
def test_parse_rejects_shared_modes_without_a_replica_count_of_at_least_two(kind: str, arg: str) -> None:
    text = f"{kind}:{arg}" if arg else kind
    with pytest.raises(InvalidSharingMode) as info:
        SharingMode.parse(text)
    message = str(info.value)
    assert f"'{text}'" in message
    assert f"{kind} needs a replica count of at least 2" in message
    assert f"e.g. {kind}:4" in message


@pytest.mark.parametrize("text", ["mig", "mig:"])
def test_parse_rejects_mig_without_a_layout(text: str) -> None:
    with pytest.raises(InvalidSharingMode, match=re.escape("mig needs a layout, e.g. mig:all-balanced")):
        SharingMode.parse(text)


@pytest.mark.parametrize("text", ["", "shared", "Exclusive", "MIG:all-balanced", "exclusive:2", "gpu:1", "mps4"])
def test_parse_rejects_unknown_modes_and_lists_the_valid_ones(text: str) -> None:
    with pytest.raises(InvalidSharingMode) as info:
        SharingMode.parse(text)
    message = str(info.value)
    assert f"'{text}' is not a sharing mode" in message
    assert "use exclusive, mig:<layout>, mps:<n> or timeslice:<n>" in message


def test_invalid_sharing_mode_is_a_value_error_so_validators_can_catch_it() -> None:
    with pytest.raises(ValueError, match="is not a sharing mode"):
        SharingMode.parse("bogus")


def test_parse_rejects_unicode_superscript_replicas_with_invalid_sharing_mode() -> None:
    with pytest.raises(InvalidSharingMode):
        SharingMode.parse("mps:²")


# --- properties of the modes -------------------------------------------------------------------


def test_only_timeslice_lacks_isolation() -> None:
    assert SharingMode.parse("exclusive").isolated
    assert SharingMode.parse("mig:all-balanced").isolated
    assert SharingMode.parse("mps:4").isolated
    assert not SharingMode.parse("timeslice:4").isolated


def test_only_mps_and_timeslice_are_shared() -> None:
    assert not SharingMode.parse("exclusive").shared
    assert not SharingMode.parse("mig:all-balanced").shared
    assert SharingMode.parse("mps:4").shared
    assert SharingMode.parse("timeslice:4").shared


# --- MIG geometry ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["exclusive", "mps:4", "timeslice:2"])
def test_non_mig_modes_have_no_mig_slices_even_on_non_mig_models(text: str) -> None:
    assert SharingMode.parse(text).mig_slices_per_gpu("L4") == {}


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("A100-40GB", {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
        ("A100-80GB", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        ("H100-80GB", {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
        ("H200-141GB", {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
    ],
)
def test_all_balanced_is_two_1g_one_2g_one_3g_per_gpu_with_model_specific_profiles(
    model: str, expected: dict[str, int]
) -> None:
    slices = SharingMode.parse("mig:all-balanced").mig_slices_per_gpu(model)
    assert slices == expected
    assert sum(mig_compute_slices(p) * n for p, n in slices.items()) == 7


def test_all_balanced_returns_a_copy_callers_cannot_corrupt() -> None:
    mode = SharingMode.parse("mig:all-balanced")
    mode.mig_slices_per_gpu("H100-80GB")["1g.10gb"] = 99
    assert mode.mig_slices_per_gpu("H100-80GB")["1g.10gb"] == 2


@pytest.mark.parametrize(
    ("model", "profile", "count"),
    [
        ("A100-40GB", "1g.10gb", 4),
        ("A100-80GB", "1g.10gb", 7),
        ("H100-80GB", "1g.10gb", 7),
        ("H100-80GB", "1g.20gb", 4),
        ("H100-80GB", "2g.20gb", 3),
        ("H100-80GB", "3g.40gb", 2),
        ("H100-80GB", "7g.80gb", 1),
        ("A100-40GB", "1g.5gb", 7),
        ("H200-141GB", "1g.18gb", 7),
    ],
)
def test_all_profile_gives_the_model_specific_maximum(model: str, profile: str, count: int) -> None:
    assert SharingMode.parse(f"mig:all-{profile}").mig_slices_per_gpu(model) == {profile: count}


def test_same_profile_string_has_different_geometry_on_different_models() -> None:
    mode = SharingMode.parse("mig:all-1g.10gb")
    assert mode.mig_slices_per_gpu("A100-40GB") == {"1g.10gb": 4}
    assert mode.mig_slices_per_gpu("H100-80GB") == {"1g.10gb": 7}


@pytest.mark.parametrize(("model", "profile"), [("H100-80GB", "1g.5gb"), ("A100-40GB", "3g.40gb"), ("H100-80GB", "x")])
def test_all_profile_rejects_a_profile_the_model_does_not_have(model: str, profile: str) -> None:
    with pytest.raises(InvalidSharingMode, match=re.escape(f"{model} has no MIG profile {profile}")):
        SharingMode.parse(f"mig:all-{profile}").mig_slices_per_gpu(model)


@pytest.mark.parametrize("model", ["L4", "T4", "h100-80gb", ""])
def test_mig_on_a_model_without_mig_support_is_rejected_listing_mig_models(model: str) -> None:
    with pytest.raises(InvalidSharingMode) as info:
        SharingMode.parse("mig:all-balanced").mig_slices_per_gpu(model)
    message = str(info.value)
    assert f"GPU model {model} does not support MIG" in message
    for mig_model in MIG_PROFILES:
        assert mig_model in message


def test_explicit_layout_counts_each_profile() -> None:
    slices = SharingMode.parse("mig:1g.10gb*2+2g.20gb+3g.40gb").mig_slices_per_gpu("H100-80GB")
    assert slices == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


def test_explicit_layout_sums_a_profile_that_appears_twice() -> None:
    slices = SharingMode.parse("mig:1g.10gb+3g.40gb+1g.10gb*2").mig_slices_per_gpu("A100-80GB")
    assert slices == {"1g.10gb": 3, "3g.40gb": 1}


@pytest.mark.parametrize(
    ("model", "layout"),
    [("H100-80GB", "7g.80gb"), ("H100-80GB", "4g.40gb+3g.40gb"), ("A100-40GB", "1g.5gb*7")],
)
def test_explicit_layout_may_use_exactly_seven_compute_slices(model: str, layout: str) -> None:
    slices = SharingMode.parse(f"mig:{layout}").mig_slices_per_gpu(model)
    assert sum(mig_compute_slices(p) * n for p, n in slices.items()) == 7


@pytest.mark.parametrize(
    ("model", "layout"),
    [
        ("H100-80GB", "7g.80gb+1g.10gb"),
        ("H100-80GB", "3g.40gb*3"),
        ("A100-80GB", "1g.10gb*8"),
        ("A100-40GB", "4g.20gb*2"),
    ],
)
def test_explicit_layout_over_seven_compute_slices_is_rejected(model: str, layout: str) -> None:
    with pytest.raises(InvalidSharingMode, match="needs more than 7 compute slices"):
        SharingMode.parse(f"mig:{layout}").mig_slices_per_gpu(model)


def test_explicit_layout_rejects_a_profile_of_another_model() -> None:
    with pytest.raises(InvalidSharingMode, match=re.escape("A100-40GB has no MIG profile 3g.40gb")):
        SharingMode.parse("mig:1g.5gb+3g.40gb").mig_slices_per_gpu("A100-40GB")


def test_explicit_layout_cannot_exceed_the_per_model_instance_maximum() -> None:
    with pytest.raises(InvalidSharingMode):
        SharingMode.parse("mig:1g.10gb*7").mig_slices_per_gpu("A100-40GB")


def test_explicit_layout_respects_memory_slices_not_just_compute_slices() -> None:
    with pytest.raises(InvalidSharingMode):
        SharingMode.parse("mig:3g.20gb*2+1g.5gb").mig_slices_per_gpu("A100-40GB")


def test_explicit_layout_rejects_negative_counts() -> None:
    with pytest.raises(InvalidSharingMode):
        SharingMode.parse("mig:1g.10gb*-1+7g.80gb").mig_slices_per_gpu("H100-80GB")


def test_explicit_layout_rejects_a_non_numeric_count_with_invalid_sharing_mode() -> None:
    with pytest.raises(InvalidSharingMode):
        SharingMode.parse("mig:1g.10gb*two").mig_slices_per_gpu("H100-80GB")


# --- MIG compute slices and gpu-eq -------------------------------------------------------------


@pytest.mark.parametrize(
    ("profile", "slices", "eq"),
    [
        ("1g.10gb", 1, Fraction(1, 7)),
        ("2g.20gb", 2, Fraction(2, 7)),
        ("3g.40gb", 3, Fraction(3, 7)),
        ("4g.40gb", 4, Fraction(4, 7)),
        ("7g.80gb", 7, Fraction(1)),
    ],
)
def test_mig_gpu_eq_is_compute_slices_over_seven(profile: str, slices: int, eq: Fraction) -> None:
    assert mig_compute_slices(profile) == slices
    assert mig_gpu_eq(profile) == eq


@pytest.mark.parametrize("profile", ["", "gpu", "g.10gb", "xg.10gb", "1.10gb", "10gb", "1G.10gb"])
def test_mig_compute_slices_rejects_non_profiles(profile: str) -> None:
    with pytest.raises(InvalidSharingMode, match=re.escape("is not a MIG profile like 3g.40gb")):
        mig_compute_slices(profile)


def test_every_known_profile_has_a_gpu_eq_between_one_seventh_and_one() -> None:
    for table in MIG_PROFILES.values():
        for profile in table:
            assert Fraction(1, 7) <= mig_gpu_eq(profile) <= 1


# --- shares_for_fraction -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fraction", "replicas", "shares"),
    [
        (0.25, 4, 1),
        (0.5, 4, 2),
        (0.75, 4, 3),
        (0.3, 4, 2),
        (0.3, 10, 3),
        (0.7, 10, 7),
        (0.01, 4, 1),
        (0.1, 2, 1),
        (0.99, 4, 4),
        (1.0, 4, 4),
    ],
)
def test_shares_for_fraction_rounds_up_to_whole_shares(fraction: float, replicas: int, shares: int) -> None:
    assert shares_for_fraction(fraction, replicas) == shares


@given(replicas=st.integers(2, 64), data=st.data())
def test_shares_for_fraction_exact_fractions_take_exactly_their_shares(replicas: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, replicas))
    assert shares_for_fraction(k / replicas, replicas) == k


@given(fraction=st.floats(0.001, 1.0), replicas=st.integers(2, 64))
def test_shares_for_fraction_is_the_smallest_share_count_covering_the_fraction(fraction: float, replicas: int) -> None:
    shares = shares_for_fraction(fraction, replicas)
    assert 1 <= shares <= replicas
    assert shares / replicas >= fraction - 1e-9
    assert shares == 1 or (shares - 1) / replicas < fraction


@given(st.sampled_from(["mps", "timeslice"]), st.integers(2, 1000))
def test_shared_modes_round_trip_for_any_replica_count(kind: str, replicas: int) -> None:
    mode = SharingMode.parse(f"{kind}:{replicas}")
    assert mode.kind == kind
    assert mode.replicas == replicas
    assert str(mode) == f"{kind}:{replicas}"
