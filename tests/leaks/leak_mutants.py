"""The leak mutants: small source changes that break one honesty guarantee each (the future leaks
into an input, splits mix, data is mislabelled, a "valid" result is not), and the tests that must
catch them. tests/leaks/test_leaks.py applies each to a copy of the package and runs its guards.

A mutant is exact text replaced in one file (several edits when a bug needs them, e.g. a safety
`assert` in the code removed along with the bug, so that a test, not the code's own check, has to
notice). Each old text must occur exactly once in its file: when a refactor moves the code, the
list check fails and names the mutant, instead of the tier passing on code it no longer touches.

A guard is a pytest node id. The tier demands that every guard FAILS ON AN ASSERTION on the mutant
(an AssertionError or pytest.fail / "DID NOT RAISE" raised outside the package under test) and
passes on the unmutated code. An import error, a crash or a TypeError does not count.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    guarantee: str  # the row of the README's "Guarantees proven by mutants" table
    file: str  # relative to the repository root, under trainers/
    edits: tuple[tuple[str, str], ...]  # (old text, new text), applied in order
    guards: tuple[str, ...]  # pytest node ids, relative to the repository root
    breaks: str  # what the mutant does, in words


WINDOWS = "tests/unit/test_windows.py"
FC_WF = "tests/forecast/test_forecast_walk_forward.py"
PPO_ENV = "tests/ppo/test_ppo_env.py"
PPO_GUARDS = "tests/ppo/test_ppo_guards.py"
LSTM_FEATURES = "tests/lstm/test_lstm_features.py"
LSTM_GUARDS = "tests/lstm/test_lstm_guards.py"
GPT_UNITS = "tests/gpt/test_gpt_units.py"
REMOTE_FAULTS = "tests/unit/test_remote_faults.py"

MUTANTS: tuple[Mutant, ...] = (
    # ---- the forecaster's windows ---------------------------------------------------------------
    Mutant("forecast_target_one_day_early", "forecaster windows", "trainers/forecast/data.py",
           (("forward[:-horizon] = log_close[horizon:] - log_close[:-horizon]",
             "forward[1:n_dates - horizon + 1] = log_close[horizon:] - log_close[:-horizon]"),),
           (f"{WINDOWS}::test_target_is_forward_log_return",),
           "the label is the return from t-1 to t+h-1: it contains day t's return, an input"),
    Mutant("forecast_input_row_from_target_period", "forecaster windows", "trainers/forecast/data.py",
           (("rows = t[:, None] + torch.arange(-self.window + 1, 1, device=ids.device)[None, :]",
             "rows = t[:, None] + torch.arange(-self.window + 2, 2, device=ids.device)[None, :]"),),
           (f"{WINDOWS}::test_gather_matches_a_window_built_by_hand",),
           "the window gathered for anchor t ends at t+1, a day of the target period"),
    Mutant("embargo_zero", "forecaster windows", "trainers/market/windows.py",
           (("embargo = window + horizon + LOOKBACK", "embargo = 0"),),
           (f"{WINDOWS}::test_no_window_or_target_of_one_split_touches_another",),
           "no gap between train, validation and test"),
    Mutant("embargo_without_lookback", "forecaster windows", "trainers/market/windows.py",
           (("embargo = window + horizon + LOOKBACK", "embargo = window + horizon"),),
           (f"{WINDOWS}::test_no_window_or_target_of_one_split_touches_another",),
           "the embargo forgets the features' 20-day look-back: a validation input reads training days"),
    # ---- causal features and normalisation ------------------------------------------------------
    Mutant("feature_reads_t_plus_1", "causal features / normalisation", "trainers/market/windows.py",
           (("ret_1d = np.vstack([np.full((1, p.shape[1]), np.nan), np.diff(log_close, axis=0)])",
             "ret_1d = np.vstack([np.diff(log_close, axis=0), np.full((1, p.shape[1]), np.nan)])"),),
           (f"{WINDOWS}::test_features_are_causal",),
           "the 1-day return at t is the one from t to t+1"),
    Mutant("forecast_normalised_with_all_dates", "causal features / normalisation", "trainers/forecast/data.py",
           (("train_rows = feats[:train_stop].reshape(-1, n_features)",
             "train_rows = feats.reshape(-1, n_features)"),),
           (f"{WINDOWS}::test_normalisation_uses_training_period_only",),
           "feature mean and std from every date, validation and test included"),
    Mutant("ppo_indicator_reads_t_plus_1", "causal features / normalisation", "trainers/ppo/features.py",
           (("ret = np.log(c / c.shift(1))", "ret = np.log(c.shift(-1) / c)"),),
           (f"{PPO_ENV}::test_features_are_causal_and_normalised_with_training_statistics_only",
            f"{PPO_GUARDS}::test_no_indicator_at_or_before_t_moves_when_the_next_days_change"),
           "the agent's 1-day return indicator at t is tomorrow's"),
    Mutant("ppo_indicator_reads_t_plus_1_without_a_gap", "causal features / normalisation", "trainers/ppo/features.py",
           (("typical = (h + lo + c) / 3.0", "typical = (h + lo + c.shift(-1).fillna(c)) / 3.0"),),
           (f"{PPO_GUARDS}::test_no_indicator_at_or_before_t_moves_when_the_next_days_change",),
           "CCI's typical price at t uses tomorrow's close, and the last row stays finite"),
    Mutant("ppo_normalised_with_all_dates", "causal features / normalisation", "trainers/ppo/features.py",
           (("train_rows = feats[:train_stop].reshape(-1, len(FEATURES))",
             "train_rows = feats.reshape(-1, len(FEATURES))"),),
           (f"{PPO_ENV}::test_features_are_causal_and_normalised_with_training_statistics_only",),
           "the agent's z-scores from every date"),
    Mutant("lstm_normalised_with_all_bars", "causal features / normalisation", "trainers/lstm/features.py",
           (("mean = np.nanmean(feats[:train_stop], axis=0)  # the training period only\n"
             "    std = np.nanstd(feats[:train_stop], axis=0)",
             "mean = np.nanmean(feats, axis=0)\n    std = np.nanstd(feats, axis=0)"),),
           (f"{LSTM_FEATURES}::test_normalisation_comes_from_the_training_period_only",),
           "an LSTM's normalisation from every bar"),
    # ---- splits and walk-forward ----------------------------------------------------------------
    Mutant("validation_overlaps_test", "splits, walk-forward", "trainers/market/windows.py",
           (('ranges["val"] = (a, a + n_val)', 'ranges["val"] = (a, a + n_val + embargo + 10)'),),
           (f"{WINDOWS}::test_no_window_or_target_of_one_split_touches_another",),
           "validation runs over the embargo into the test's first 10 dates"),
    Mutant("walk_forward_test_inside_training", "splits, walk-forward", "trainers/market/windows.py",
           (('ranges["train"] = (last.first_anchor, ranges["train"][1])',
             'ranges["train"] = (last.first_anchor, last.ranges["train"][1])'),),
           (f"{FC_WF}::test_folds_expand_tile_the_end_and_keep_their_embargo",),
           "every fold trains on the last fold's training range, which holds the earlier folds' tests"),
    Mutant("walk_forward_test_blocks_overlap", "splits, walk-forward", "trainers/market/windows.py",
           (("shift = (folds - 1 - k) * n_test", "shift = (folds - 1 - k) * (n_test // 2)"),),
           (f"{FC_WF}::test_folds_expand_tile_the_end_and_keep_their_embargo",),
           "consecutive folds' test blocks overlap by half: the same dates are counted twice"),
    Mutant("ridge_baseline_fitted_on_test_rows", "splits, walk-forward", "trainers/forecast/baselines.py",
           (('ids = store.sample_ids["train"]\n    dim = store.window',
             'ids = torch.cat([store.sample_ids["train"], store.sample_ids["test"]])\n    dim = store.window'),),
           ("tests/forecast/test_forecast_guards.py::test_the_ridge_baseline_never_reads_a_test_label",),
           "the ridge baseline the model is judged against is fitted on the test rows too"),
    Mutant("ridge_penalty_chosen_on_test", "splits, walk-forward", "trainers/forecast/baselines.py",
           (('val_y = store.target[store.date_index(store.sample_ids["val"]), store.sample_ids["val"] % store.n_tickers]',
             'val_y = store.target[store.date_index(store.sample_ids["test"]), store.sample_ids["test"] % store.n_tickers]'),
            ('mse = float(np.mean((predict(weights, "val") - val_y) ** 2))',
             'mse = float(np.mean((predict(weights, "test") - val_y) ** 2))')),
           ("tests/forecast/test_forecast_guards.py::test_the_ridge_baseline_never_reads_a_test_label",),
           "the ridge baseline's penalty is picked by its test error"),
    # ---- the point-in-time universe -------------------------------------------------------------
    Mutant("member_one_day_after_removal", "point-in-time universe", "trainers/market/pit.py",
           (("inside &= d < np.datetime64(row.removed)", "inside &= d <= np.datetime64(row.removed)"),),
           ("tests/forecast/test_forecast_guards.py::test_a_member_counts_from_the_day_it_joins_to_the_day_before_it_leaves",
            "tests/forecast/test_forecast_data.py::test_sp500_pit_uses_each_company_only_while_it_was_in_the_index"),
           "a company is still a sample on the day it left the index"),
    Mutant("member_one_day_before_joining", "point-in-time universe", "trainers/market/pit.py",
           (("inside = d >= np.datetime64(row.added)",
             'inside = d >= np.datetime64(row.added) - np.timedelta64(1, "D")'),),
           ("tests/forecast/test_forecast_guards.py::test_a_member_counts_from_the_day_it_joins_to_the_day_before_it_leaves",),
           "a company is a sample the day before it joined"),
    # ---- PPO ------------------------------------------------------------------------------------
    Mutant("ppo_window_reaches_t_plus_1", "PPO", "trainers/ppo/env.py",
           (("rows = t[:, None] + torch.arange(1 - window, 1, device=t.device)[None, :]",
             "rows = t[:, None] + torch.arange(2 - window, 2, device=t.device)[None, :]"),),
           (f"{PPO_GUARDS}::test_the_window_of_a_decision_ends_at_its_date_in_the_evaluation_loop",),
           "the agent's window at decision t ends at t+1: it sees tomorrow's return"),
    Mutant("ppo_evaluation_shows_t_plus_1", "PPO", "trainers/ppo/evaluate.py",
           (("for days in torch.arange(start, stop, device=market.device).split(per_pass):",
             "for days in torch.arange(start + 1, stop + 1, device=market.device).split(per_pass):"),),
           (f"{PPO_GUARDS}::test_the_window_of_a_decision_ends_at_its_date_in_the_evaluation_loop",),
           "validation and test backtests show the agent tomorrow's row"),
    Mutant("ppo_training_shows_t_plus_1", "PPO", "trainers/ppo/train.py",
           (("inputs = lambda obs: (market.windows(obs[0], cfg.window), obs[1])",
             "inputs = lambda obs: (market.windows(obs[0] + 1, cfg.window), obs[1])"),),
           (f"{PPO_GUARDS}::test_training_rollouts_show_each_environment_the_window_ending_at_its_own_date",),
           "training rollouts show the agent tomorrow's row"),
    Mutant("ppo_reward_earns_the_seen_return", "PPO", "trainers/ppo/env.py",
           (("        filled = self.trade(action)\n        self.t.add_(1)\n        return filled, self.value()\n",
             "        filled = self.trade(action)\n        value_after = self.value()\n"
             "        filled[\"value_before\"] = self.cash + (self.shares * self.market.close[self.t - 1]).sum(-1)\n"
             "        self.t.add_(1)\n        return filled, value_after\n"),),
           (f"{PPO_ENV}::test_environment_equals_the_numpy_reference_over_random_actions[trades-pnl-10.0]",),
           "the reward is the new holdings' move from close t-1 to close t, already seen"),
    # ---- LSTM -----------------------------------------------------------------------------------
    Mutant("lstm_higher_bar_before_it_closes", "LSTM", "trainers/lstm/features.py",
           (("closed = np.searchsorted(end[first],", "closed = np.searchsorted(start[first],"),),
           (f"{LSTM_FEATURES}::test_changing_every_bar_after_t_moves_no_feature_at_or_before_t[stock days (weekdays)]",),
           "the weekly and monthly bars are shown from their first day (the seed's open-time join)"),
    Mutant("lstm_4h_bar_an_hour_early", "LSTM", "trainers/lstm/features.py",
           (('return ts + np.timedelta64(base.minutes, "m")', 'return ts + np.timedelta64(2 * base.minutes, "m")'),),
           (f"{LSTM_FEATURES}::test_changing_every_bar_after_t_moves_no_feature_at_or_before_t[crypto hours]",),
           "an intraday higher bar counts as closed one base bar before it does"),
    Mutant("lstm_label_shifted", "LSTM", "trainers/lstm/features.py",
           (("ret[:-horizon] = np.log(close[horizon:] / close[:-horizon])",
             "ret[1:len(close) - horizon + 1] = np.log(close[horizon:] / close[:-horizon])"),),
           (f"{LSTM_FEATURES}::test_target_is_the_direction_over_the_horizon_with_a_dead_zone",),
           "the label starts one bar earlier: at horizon 1 it is the bar that just closed, an input"),
    Mutant("lstm_window_reaches_t_plus_1", "LSTM", "trainers/lstm/features.py",
           (("rows = anchors[:, None] + torch.arange(-self.window + 1, 1, device=anchors.device)[None, :]",
             "rows = anchors[:, None] + torch.arange(-self.window + 2, 2, device=anchors.device)[None, :]"),),
           (f"{LSTM_GUARDS}::test_a_window_is_the_anchors_bar_and_the_ones_before_it_and_its_label_the_anchors",),
           "the model's window ends one bar after its anchor: it reads the bar it predicts"),
    Mutant("lstm_backtest_earns_the_seen_return", "LSTM", "trainers/lstm/evaluate.py",
           (("data.ret_1[trade]", "data.ret_1[trade - 1]"),),
           (f"{LSTM_GUARDS}::test_the_long_flat_backtest_earns_the_next_bar_not_the_one_just_closed",),
           "the long/flat strategy earns the bar that just closed, a return the model has seen"),
    Mutant("lstm_backtest_return_from_the_past", "LSTM", "trainers/lstm/features.py",
           (("ret_1, _ = direction_target(bars.close, 1, 0.0)",
             "ret_1 = np.r_[np.nan, np.diff(np.log(bars.close))]"),),
           (f"{LSTM_GUARDS}::test_each_anchor_earns_the_return_of_the_bar_after_it[1]",
            f"{LSTM_GUARDS}::test_the_long_flat_backtest_earns_the_next_bar_not_the_one_just_closed"),
           "the return each anchor trades is the one ending at the anchor"),
    Mutant("lstm_base_rate_from_all_splits", "LSTM", "trainers/lstm/features.py",
           (("train_up_rate=n_up / len(train_labels))", "train_up_rate=float(np.nanmean(label)))"),),
           (f"{LSTM_FEATURES}::test_class_weights_come_from_the_training_split",),
           "the base-rate predictor's up rate counts the validation and test labels"),
    Mutant("lstm_base_rate_from_the_scored_split", "LSTM", "trainers/lstm/metrics.py",
           (("base = np.full_like(p, min(max(train_up_rate, EPS), 1 - EPS))",
             "base = np.full_like(p, min(max(float(y.mean()), EPS), 1 - EPS))"),),
           ("tests/lstm/test_lstm_metrics.py::test_classification_metrics_beside_the_base_rate_predictor",),
           "the base rate peeks at the labels it is scored on"),
    # ---- GPT ------------------------------------------------------------------------------------
    Mutant("gpt_validation_overlaps_training", "GPT", "trainers/gpt/data.py",
           (("return self.tokens[: len(self.tokens) - n_val], self.tokens[len(self.tokens) - n_val:]",
             "return self.tokens[: len(self.tokens) - n_val // 2], self.tokens[len(self.tokens) - n_val:]"),),
           (f"{GPT_UNITS}::test_tokenising_sorts_the_characters_seen_and_the_cache_is_reused",),
           "the training text runs into the first half of the validation text"),
    Mutant("gpt_floor_counts_a_context_free_prediction", "GPT", "trainers/gpt/markov.py",
           (("short = prefix[1: seq_len + 1]", "short = prefix[0: seq_len]"),),
           (f"{GPT_UNITS}::test_the_true_chain_on_the_trainers_evaluation_windows_scores_the_floor_within_its_standard_error",
            f"{GPT_UNITS}::test_a_perfect_model_has_no_gap_to_the_floor",
            f"{GPT_UNITS}::test_the_window_floor_averages_over_the_contexts_the_predictions_have"),
           "the floor counts H(X1), a prediction the trainer never makes (the once-published 1.5713)"),
    # ---- GNN ------------------------------------------------------------------------------------
    Mutant("gnn_repair_leaves_a_conflict", "GNN", "trainers/gnn/decode.py",
           (("    color = color.astype(np.int64).copy()\n",
             "    color = color.astype(np.int64).copy()\n    before = color.copy()\n"),
            ("        nbr = set(color[adj[v]].tolist())\n", "        nbr = set(before[adj[v]].tolist())\n"),
            ("    assert conflicts(g.edges, color) == 0\n", "")),
           ("tests/gnn/test_gnn_units.py::test_repair_always_returns_a_valid_coloring_and_drops_spare_colors",),
           "repair reads the neighbours' colours before repair: two adjacent nodes move to the same colour "
           "(its own safety assert removed)"),
    Mutant("gnn_search_returns_more_colours", "GNN", "trainers/gnn/search.py",
           (("from trainers.gnn.graphs import Graph, conflicts\n",
             "from trainers.gnn.graphs import Graph, conflicts, greedy_coloring\n"),
            ("        if found is None:\n            stopped = why\n",
             "        if found is None:\n            stopped = why\n"
             "            best = greedy_coloring(g.n, g.edges)\n            k = int(best.max()) + 1\n"),
            ("    assert conflicts(g.edges, best) == 0 and (not g.n or best.max() + 1 <= start_colors)\n", "")),
           ("tests/gnn/test_gnn_search.py::test_search_is_deterministic_for_a_seed_and_reaches_known_chromatic_numbers",),
           "a level the search cannot solve falls back to greedy's colouring, more colours than it had"),
    Mutant("gnn_search_returns_an_improper_colouring", "GNN", "trainers/gnn/search.py",
           (('return None, it, "budget_iters"', 'return color, it, "budget_iters"'),
            ("    assert conflicts(g.edges, best) == 0 and (not g.n or best.max() + 1 <= start_colors)\n", "")),
           ("tests/gnn/test_gnn_search.py::test_search_always_returns_a_proper_coloring_with_no_more_colors_than_its_start",),
           "a level that runs out of iterations is taken as solved, conflicts and all"),
    # ---- the published figures' market -----------------------------------------------------------
    Mutant("synthetic_market_draw_moved", "published figures' market", "trainers/market/synthetic.py",
           (("    beta = rng.normal(1.0, 0.3, n_tickers).clip(0.2, 2.0)\n    drift = rng.normal(0.0003, 0.0002, n_tickers)\n",
             "    drift = rng.normal(0.0003, 0.0002, n_tickers)\n    beta = rng.normal(1.0, 0.3, n_tickers).clip(0.2, 2.0)\n"),),
           ("tests/forecast/test_forecast_markets.py::"
            "test_the_momentum_market_is_the_one_the_published_figures_were_measured_on",),
           "two draws of the market's generator swap places: every published forecaster figure was measured on "
           "another market"),
    # ---- device placement (the fake accelerator: CUDA's rules on the CPU) -----------------------------
    Mutant("forecast_stale_train_ids", "device placement", "trainers/forecast/train.py",
           (('    n_train = len(store.sample_ids["train"])\n',
             '    train_ids = store.sample_ids["train"]\n    n_train = len(train_ids)\n'),
            ('    store.to(ctx.device)  # new tensors: a reference taken before this line would index the host copy\n'
             '    train_ids = store.sample_ids["train"]\n', '    store.to(ctx.device)\n')),
           ("tests/device/test_device_trainers.py::test_trains_on_the_fake_accelerator[forecast]",),
           "a09b8e2's forecaster: the training ids kept from before the store moved to the device, indexed with "
           "the cursor's device positions (dead at step 1 on CUDA)"),
    Mutant("population_draw_without_device", "device placement", "trainers/gnn/population.py",
           (("                shifts = torch.randint(0, 1 << 30, (block,), generator=gen, device=dev)  # (a09b8e2 drew\n"
             "                # these without device=: CUDA refused its generator for a host tensor)\n",
             "                shifts = torch.randint(0, 1 << 30, (block,), generator=gen).tolist()\n"),),
           ("tests/device/test_device_search.py::test_the_population_search_runs_on_the_device_as_on_the_host",),
           "a09b8e2's population search: a draw from the device's generator without device= (dead at its first "
           "TabuCol block on CUDA)"),
    Mutant("cohort_rows_of_another_symbol", "LSTM", "trainers/lstm/cohort.py",
           (("xs, ys = zip(*(m.data.gather(anchors) for m, anchors, _ in rows))",
             "xs, ys = zip(*(rows[0][0].data.gather(anchors) for m, anchors, _ in rows))"),),
           ("tests/lstm/test_lstm_cohort.py::test_each_symbols_weights_are_the_same_alone_and_in_a_cohort",),
           "a cohort step that feeds every member the first member's windows: each model trains on another "
           "symbol's data"),
    Mutant("lstm_alone_unclipped", "LSTM", "trainers/lstm/cohort.py",
           (("        if cfg.grad_clip > 0:\n            torch.nn.utils.clip_grad_norm_(self.model.parameters(), "
             "cfg.grad_clip)\n", ""),),
           ("tests/lstm/test_lstm_cohort.py::test_each_symbols_weights_are_the_same_alone_and_in_a_cohort"
            "[every-step-clipped]",),
           "a symbol alone (a cohort of one, nn.LSTM's kernel) stepped without its gradient clip: it trains another "
           "model than the same symbol in a cohort"),
    Mutant("lstm_job_of_failures_completed", "LSTM", "trainers/lstm/summary.py",
           (('reason = "failed" if asked["failed"] and not asked["ok"] else "partial" if asked["failed"] else '
             '"completed"', 'reason = "partial" if asked["failed"] and asked["ok"] else "completed"'),),
           ("tests/lstm/test_lstm_jobs.py::test_a_job_whose_symbols_failed_says_so_in_its_stop_reason[SYN000,SYN001-failed]",),
           "a job whose every symbol failed records stop_reason completed (issue 66: exit 1, ok 0, failed 2)"),
    # ---- the remote mirror and the files it must not lose (issue 65) -----------------------------------------
    Mutant("push_skips_the_config_check", "remote mirror", "trainers/ops/remote.py",
           (("    mirror.start(config=config)  # another run's remote is refused", "    mirror.start()"),),
           (f"{REMOTE_FAULTS}::test_a_push_of_another_run_to_a_remote_is_refused_and_the_bucket_is_unchanged",),
           "trainers remote push of one run to another run's remote replaces its config, results and logs"),
    Mutant("package_replaces_any_output", "remote mirror", "trainers/ops/package.py",
           (("    check_replaceable(output, run_dir.name)\n", ""),),
           (f"{REMOTE_FAULTS}::test_package_cli_refuses_an_existing_file_in_one_line_and_keeps_it",),
           "trainers package --output NOTES turns the user's file into a gzip"),
    Mutant("mirror_misses_a_store_emptied", "remote mirror", "trainers/runtime/remote.py",
           (("        lost = self._remote_lost_files()\n", "        lost = None\n"),),
           (f"{REMOTE_FAULTS}::test_a_store_emptied_mid_run_gets_the_whole_run_again_and_a_fresh_folder_resumes",),
           "a store restarted empty mid-run is never written again, while results.json says caught up"),
    Mutant("pull_takes_a_meta_without_its_files", "remote mirror", "trainers/runtime/remote_pull.py",
           (("        problem = checkpoint_problem(step, record)\n        if problem is None:\n",
             "        problem = None if isinstance(record, dict) else \"not a record\"\n        if problem is None:\n"),),
           (f"{REMOTE_FAULTS}::test_a_pull_passes_over_metas_that_list_nothing_or_another_steps_files_and_names_them",),
           "a pull takes a newer meta that lists no files (or another step's) over the good checkpoints"),
    Mutant("ppo_refuses_close_only_files", "remote mirror", "trainers/ppo/features.py",
           (("    from_close = ranges_from_close(panel)\n", "    from_close = []\n"),),
           ("tests/ppo/test_ppo_pipeline.py::test_a_close_only_price_file_trains_evaluates_and_exports",),
           "PPO refuses every close-only price file: no stock has a high and a low"),
)
