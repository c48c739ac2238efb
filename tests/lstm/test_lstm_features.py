"""Multi-timeframe features without look-ahead, the calendars that close higher bars, the target, the
splits and the normalisation (all in-process, NumPy only)."""

import numpy as np
import pandas as pd
import pytest

from trainers.errors import UsageError
from trainers.lstm.bars import SEVEN_DAYS, WEEKDAYS, Bars, base_timeframe, calendar_of
from trainers.lstm.config import LstmConfig, parse_timeframe, resolve_timeframes
from trainers.lstm.features import (
    build_symbol_data,
    direction_target,
    higher_history_bars,
    period_bounds,
    raw_features,
)
from trainers.market.windows import LOOKBACK


def make_bars(ts: pd.DatetimeIndex, seed: int = 0, symbol: str = "TEST") -> Bars:
    rng = np.random.default_rng(seed)
    ts = ts.to_numpy(dtype="datetime64[ns]")
    close = 100 * np.exp(np.cumsum(rng.normal(0, 0.01, len(ts))))
    open_ = close * np.exp(rng.normal(0, 0.003, len(ts)))
    high = np.maximum(open_, close) * np.exp(np.abs(rng.normal(0, 0.004, len(ts))))
    low = np.minimum(open_, close) * np.exp(-np.abs(rng.normal(0, 0.004, len(ts))))
    volume = rng.uniform(1e5, 1e6, len(ts))
    return Bars(symbol, ts, open_, high, low, close, volume, base_timeframe(ts, symbol), calendar_of(ts))


CASES = {  # bars, timeframes
    "stock days (weekdays)": (lambda: make_bars(pd.bdate_range("2021-01-04", periods=400)), "1d,1w,1M"),
    "crypto days (7 days)": (lambda: make_bars(pd.date_range("2021-01-01", periods=400, freq="D")), "1d,1w,1M"),
    "crypto hours": (lambda: make_bars(pd.date_range("2021-03-01", periods=24 * 40, freq="h")), "1h,4h,1d,1w"),
    "crypto 15-minute bars": (lambda: make_bars(pd.date_range("2021-03-01", periods=96 * 6, freq="15min")),
                              "15m,1h,4h,1d"),
}


def tfs_of(bars: Bars, text: str):
    return resolve_timeframes(text, bars.base)


@pytest.mark.parametrize("case", CASES)
def test_changing_every_bar_after_t_moves_no_feature_at_or_before_t(case):
    make, text = CASES[case]
    bars = make()
    tfs = tfs_of(bars, text)
    feats, names, _ = raw_features(bars, tfs)
    rng = np.random.default_rng(1)
    ts = pd.DatetimeIndex(bars.ts)
    moved_later = {tf.label: False for tf in tfs}
    for t in range(len(bars) - 1):  # every t: a leak may show only at a rare calendar corner
        changed = bars.replace_after(t, rng)
        got, _, _ = raw_features(changed, tfs)
        same = np.isclose(got[: t + 1], feats[: t + 1], rtol=0, atol=0, equal_nan=True)
        assert same.all(), (f"{case}: features at or before {ts[t]} moved when later bars changed: "
                            f"{[names[j] for j in np.flatnonzero(~same.all(axis=0))]}")
        for tf in tfs:
            cols = [j for j, n in enumerate(names) if n.startswith(f"{tf.label}:")]
            later = ~np.isclose(got[t + 1:, cols], feats[t + 1:, cols], equal_nan=True)
            moved_later[tf.label] |= bool(later.any())
    assert all(moved_later.values()), f"the test has no teeth for {moved_later}"  # later features did change


def open_time_join(bars: Bars, tf) -> np.ndarray:
    """The seed's join: each base bar gets the higher bar it falls in, as of that bar's period close."""
    start, _ = period_bounds(bars.ts, tf)
    close = pd.Series(bars.close).groupby(start).transform("last").to_numpy()
    return np.log(close / bars.close)


def test_the_seeds_open_time_join_fails_the_same_check():
    bars = make_bars(pd.date_range("2021-03-01", periods=24 * 10, freq="h"))
    tf = parse_timeframe("4h")
    t = 24 * 5 + 1  # 01:00: its 4h bar (00:00-04:00) is not closed yet
    before = open_time_join(bars, tf)
    after = open_time_join(bars.replace_after(t, np.random.default_rng(0)), tf)
    assert not np.isclose(before[: t + 1], after[: t + 1]).all()


@pytest.mark.parametrize("case,tf,closing", [
    ("stock days (weekdays)", "1w", lambda ts: ts.day_of_week == 4),  # a stock's week closes with Friday's bar
    ("crypto days (7 days)", "1w", lambda ts: ts.day_of_week == 6),  # a crypto week with Sunday's
    ("stock days (weekdays)", "1M", lambda ts: ts.is_month_end | ((ts + pd.offsets.BDay(1)).month != ts.month)),
    ("crypto days (7 days)", "1M", lambda ts: ts.is_month_end),
    ("crypto hours", "4h", lambda ts: ts.hour % 4 == 3),  # the 03:00 bar closes at 04:00
    ("crypto hours", "1d", lambda ts: ts.hour == 23),
])
def test_a_higher_bar_becomes_visible_exactly_at_the_bar_that_closes_it(case, tf, closing):
    bars = CASES[case][0]()
    feats, names, _ = raw_features(bars, tfs_of(bars, CASES[case][1]))
    ts = pd.DatetimeIndex(bars.ts)
    gap = feats[:, names.index(f"{tf}:gap")]  # log(close now / close of the last closed higher bar)
    ret = feats[:, names.index(f"{tf}:ret")]
    defined = np.isfinite(gap)
    assert defined[-1] and not defined[0]
    expected = np.asarray(closing(ts)) & defined
    assert np.array_equal(gap == 0.0, expected)  # 0 exactly at the closing bar: its close is the higher close
    changes = np.flatnonzero(np.isfinite(ret[1:]) & np.isfinite(ret[:-1]) & (ret[1:] != ret[:-1])) + 1
    assert set(changes) <= set(np.flatnonzero(expected))  # a new higher bar appears only where one closed


def test_a_weekday_calendar_holiday_friday_shows_the_week_at_the_next_bar():
    days = pd.bdate_range("2021-01-04", periods=60)
    days = days[days != pd.Timestamp("2021-01-29")]  # a Friday without trading
    bars = make_bars(days)
    feats, names, _ = raw_features(bars, tfs_of(bars, "1d,1w"))
    gap = pd.Series(feats[:, names.index("1w:gap")], index=days)
    assert gap[pd.Timestamp("2021-01-28")] != 0  # Thursday: Friday might still trade, the week is open
    prev_week_close = bars.close[days.get_loc(pd.Timestamp("2021-01-28"))]
    monday = days.get_loc(pd.Timestamp("2021-02-01"))
    assert np.isclose(np.exp(-gap.iloc[monday]) * bars.close[monday], prev_week_close)  # shown on Monday


def test_calendars_and_base_intervals_are_per_symbol():
    assert calendar_of(pd.bdate_range("2021-01-04", periods=20).to_numpy()) == WEEKDAYS
    assert calendar_of(pd.date_range("2021-01-04", periods=20, freq="D").to_numpy()) == SEVEN_DAYS
    assert base_timeframe(pd.date_range("2021-01-04", periods=5, freq="h").to_numpy(), "X").label == "1h"
    assert base_timeframe(pd.date_range("2021-01-04", periods=5, freq="5min").to_numpy(), "X").label == "5m"
    assert base_timeframe(pd.bdate_range("2021-01-04", periods=5).to_numpy(), "X").label == "1d"
    with pytest.raises(UsageError, match="do not divide a day"):
        base_timeframe(pd.date_range("2021-01-04", periods=5, freq="7min").to_numpy(), "X")


@pytest.mark.parametrize("text,base,needle", [
    ("1d,1w,1M", "1h", "first timeframe must be the base bars' interval, 1h"),
    ("1h,90m", "1h", "90m is not a whole number of 1h bars"),
    ("1h,7h", "1h", "'7h' does not divide a day"),
    ("15m,20m", "15m", "20m is not a whole number of 15m bars"),
    ("1h,4h,4h", "1h", "each longer than the one before"),
    ("1d,2w", "1d", "one at a time"),
    ("1d,weekly", "1d", "is not a timeframe"),
])
def test_timeframes_that_do_not_divide_are_refused(text, base, needle):
    with pytest.raises(UsageError, match=needle):
        resolve_timeframes(text, parse_timeframe(base))


def test_auto_timeframes_follow_the_base_bars():
    assert [t.label for t in resolve_timeframes("auto", parse_timeframe("1d"))] == ["1d", "1w", "1M"]
    assert [t.label for t in resolve_timeframes("auto", parse_timeframe("1h"))] == ["1h", "4h", "1d"]
    assert [t.label for t in resolve_timeframes("auto", parse_timeframe("5m"))] == ["5m", "1d"]


def test_target_is_the_direction_over_the_horizon_with_a_dead_zone():
    close = np.array([100.0, 101.0, 100.5, 100.5, 99.0, 99.2])
    ret, label = direction_target(close, 2, 0.002)
    assert np.allclose(ret[:4], np.log([100.5 / 100, 100.5 / 101, 99 / 100.5, 99.2 / 100.5]))
    # +0.50% up; -0.50% down; -1.50% down; -1.30% down; the last two have no future
    assert np.array_equal(label[:4], [1, 0, 0, 0]) and np.isnan(label[4:]).all()
    _, label = direction_target(close, 1, 0.006)  # +0.995% up, -0.50% inside the zone, 0 inside, ...
    assert label[0] == 1 and np.isnan(label[1]) and np.isnan(label[2]) and label[3] == 0


def small_cfg(**kw) -> LstmConfig:
    return LstmConfig(**{"window": 16, "min_split_bars": 20, **kw})


def test_splits_are_chronological_with_an_embargo_no_input_or_target_bar_is_shared():
    bars = CASES["stock days (weekdays)"][0]()
    bars = make_bars(pd.bdate_range("2015-01-05", periods=900))
    cfg = small_cfg(horizon=3)
    tfs = tfs_of(bars, "1d,1w,1M")
    data = build_symbol_data(bars, cfg, tfs)
    reach = cfg.window - 1 + LOOKBACK + higher_history_bars(tfs)  # bars an anchor's features read, backwards
    spans = {}
    for split in ("train", "val", "test"):
        anchors = data.ids[split].numpy()
        spans[split] = (anchors.min() - reach, anchors.max() + cfg.horizon)  # inputs .. target bars
        assert np.all(np.diff(anchors) > 0)
    assert spans["train"][1] < spans["val"][0] and spans["val"][1] < spans["test"][0]
    assert data.plan.embargo >= cfg.window + cfg.horizon + LOOKBACK


def test_normalisation_comes_from_the_training_period_only():
    bars = make_bars(pd.bdate_range("2015-01-05", periods=900))
    cfg = small_cfg()
    tfs = tfs_of(bars, "1d,1w,1M")
    data = build_symbol_data(bars, cfg, tfs)
    last_train_anchor = data.plan.ranges["train"][1] - 1
    other = build_symbol_data(bars.replace_after(last_train_anchor, np.random.default_rng(3)), cfg, tfs)
    assert data.feature_mean == other.feature_mean and data.feature_std == other.feature_std
    rows = last_train_anchor + 1
    assert np.array_equal(data.features[:rows].numpy(), other.features[:rows].numpy())
    assert not np.array_equal(data.features[rows:].numpy(), other.features[rows:].numpy())


def test_class_weights_come_from_the_training_split():
    bars = make_bars(pd.bdate_range("2015-01-05", periods=900))
    tfs = tfs_of(bars, "1d,1w")
    data = build_symbol_data(bars, small_cfg(), tfs)
    y = data.label[data.ids["train"]].numpy()
    assert data.pos_weight == pytest.approx((y == 0).sum() / (y == 1).sum())
    assert data.train_up_rate == pytest.approx(y.mean())
    assert build_symbol_data(bars, small_cfg(class_weights=False), tfs).pos_weight == 1.0


def test_too_little_history_names_the_symbol_and_what_is_needed():
    bars = make_bars(pd.bdate_range("2015-01-05", periods=300), symbol="SHORT")
    with pytest.raises(UsageError, match=r"SHORT: too little history: 300 1d bars .* need \d+ bars"):
        build_symbol_data(bars, small_cfg(), tfs_of(bars, "1d,1w,1M"))
