"""Evaluation of one symbol's model on validation and test, beside its baselines (trainers.lstm.metrics;
the linear one, a logistic regression on the last bar's features, is fitted here), and `trainers lstm
evaluate` over a job's symbols."""

from __future__ import annotations

import numpy as np
import torch

from trainers.lstm.features import SymbolData
from trainers.lstm.metrics import classification_metrics, long_flat_strategy
from trainers.lstm.model import DirectionLSTM


@torch.no_grad()
def predict_logits(model: DirectionLSTM, data: SymbolData, anchors: torch.Tensor, batch_size: int) -> torch.Tensor:
    was_training = model.training
    model.eval()
    out = [model(data.gather(anchors[i:i + batch_size])[0]) for i in range(0, len(anchors), batch_size)]
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, device=anchors.device)


def validation_loss(model: DirectionLSTM, data: SymbolData, batch_size: int) -> float:
    """Log loss (unweighted BCE on the logits) over every labelled validation window: the metric
    that picks the best checkpoint and drives early stopping."""
    anchors = data.ids["val"]
    logits = predict_logits(model, data, anchors, batch_size)
    return float(torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), data.label[anchors]))


def fit_logistic_regression(data: SymbolData, l2: float = 1e-3, iters: int = 50) -> torch.nn.Linear:
    """The linear anchor: logistic regression on the last bar's (normalised) features, class-weighted
    like the model (direction_loss) plus `l2` times the weights' squared norm, fitted on the training
    split on the host. Newton's method in float64 with step halving: the problem is convex and has a few
    weights, so it converges in a handful of (F+1)x(F+1) solves (the L-BFGS it replaces took about a
    hundred closures: 14 ms of a symbol's ~100 ms of bookkeeping on a CPU)."""
    anchors = data.ids["train"]
    x = data.features[anchors].double().cpu().numpy()
    y = data.label[anchors].double().cpu().numpy()
    weights = newton_logistic(x, y, float(data.pos_weight), l2, iters)
    linear = torch.nn.Linear(data.n_features, 1)
    with torch.no_grad():
        linear.weight.copy_(torch.from_numpy(weights[:-1])[None])
        linear.bias.fill_(float(weights[-1]))
    return linear


def logistic_objective(theta: np.ndarray, x: np.ndarray, y: np.ndarray, pos_weight: float, l2: float
                       ) -> tuple[float, np.ndarray, np.ndarray]:
    """direction_loss + l2 |w|^2 at theta = [w, b]: its value, gradient and Hessian."""
    z = x @ theta[:-1] + theta[-1]
    scale = pos_weight * y + (1 - y)  # the positive rows' weight
    log_sigmoid, log_one_minus = -np.logaddexp(0.0, -z), -np.logaddexp(0.0, z)
    n = len(y)
    value = float(-(pos_weight * y * log_sigmoid + (1 - y) * log_one_minus).mean() + l2 * theta[:-1] @ theta[:-1])
    p = np.exp(log_sigmoid)
    d1, d2 = scale * p - pos_weight * y, scale * p * (1 - p)  # d/dz and d2/dz2 of each row's loss
    xa = np.hstack([x, np.ones((n, 1))])
    ridge = np.full(len(theta), 2 * l2)
    ridge[-1] = 0.0  # (the bias is not penalised, as in the L-BFGS fit it replaced)
    gradient = xa.T @ d1 / n + ridge * theta
    hessian = (xa * d2[:, None]).T @ xa / n + np.diag(ridge)
    return value, gradient, hessian


def newton_logistic(x: np.ndarray, y: np.ndarray, pos_weight: float, l2: float, iters: int) -> np.ndarray:
    theta = np.zeros(x.shape[1] + 1)
    value, gradient, hessian = logistic_objective(theta, x, y, pos_weight, l2)
    for _ in range(iters):
        step = np.linalg.lstsq(hessian, gradient, rcond=None)[0]  # (a flat bias direction: one class only)
        t = 1.0
        while t > 1e-8:  # halve until the objective does not rise
            trial = theta - t * step
            trial_value, trial_gradient, trial_hessian = logistic_objective(trial, x, y, pos_weight, l2)
            if trial_value <= value:
                break
            t /= 2
        else:
            break
        converged = np.max(np.abs(theta - trial)) < 1e-10
        theta, value, gradient, hessian = trial, trial_value, trial_gradient, trial_hessian
        if converged:
            break
    return theta


def bars_per_year(ts: np.ndarray) -> float:
    years = (ts[-1] - ts[0]) / np.timedelta64(1, "D") / 365.25
    return float((len(ts) - 1) / years) if years > 0 else float("nan")


EVALUATED_SPLITS = ("val", "test")


def evaluation_anchors(data: SymbolData, splits=EVALUATED_SPLITS) -> list[torch.Tensor]:
    """The windows an evaluation scores, per split: its labelled anchors (the metrics) and every anchor
    (the strategy) as one sorted set, so the model runs once over each window (the two sets are nearly the
    same: scored apart, the evaluation ran the model twice over a split)."""
    device = data.ids[splits[0]].device
    return [torch.from_numpy(scored_anchors(data.ids[split].cpu().numpy(), data.trade_ids[split])).to(device)
            for split in splits]


def scored_anchors(labelled: np.ndarray, trade: np.ndarray) -> np.ndarray:
    """A split's labelled and trading anchors (host arrays) as the one sorted set its logits are for."""
    return np.union1d(labelled, trade)


def evaluate_symbol(model: DirectionLSTM, data: SymbolData, batch_size: int, cost_bps: float, bins: int,
                    splits=EVALUATED_SPLITS) -> dict:
    """Per split: classification metrics on the labelled windows, the long/flat strategy on every
    window (the model run here; a cohort runs its members' models together, trainers.lstm.cohort)."""
    return evaluate_logits(data, symbol_logits(model, data, batch_size, splits), cost_bps, bins, splits)


def symbol_logits(model: DirectionLSTM, data: SymbolData, batch_size: int, splits=EVALUATED_SPLITS
                  ) -> list[np.ndarray]:
    """The model's logits on `evaluation_anchors(data, splits)`, on the host: what evaluate_logits takes."""
    return [predict_logits(model, data, anchors, batch_size).float().cpu().numpy()
            for anchors in evaluation_anchors(data, splits)]


def evaluate_logits(data: SymbolData, logits: list[np.ndarray], cost_bps: float, bins: int,
                    splits=EVALUATED_SPLITS) -> dict:
    """The evaluation from the model's logits on `evaluation_anchors(data, splits)` (one array per split),
    beside the baselines (the linear one fitted here); probabilities only here (sigmoid of the logit). Host
    work only."""
    out = {}
    per_year = bars_per_year(data.ts)
    linear = fit_logistic_regression(data)
    label, features = data.label.cpu(), data.features.cpu()  # one copy each, then host indexing only
    for index, split in enumerate(splits):
        labelled, trade = data.ids[split].cpu().numpy(), data.trade_ids[split]
        scored = scored_anchors(labelled, trade)  # the anchors of logits[index], sorted
        if len(logits[index]) != len(scored):
            raise ValueError(f"{data.symbol} {split}: {len(logits[index])} logits for {len(scored)} anchors")
        p_scored = sigmoid(logits[index])
        p = p_scored[np.searchsorted(scored, labelled)]
        y = label[labelled].double().numpy()
        with torch.no_grad():  # the linear baseline lives on the host
            linear_p = torch.sigmoid(linear(features[labelled]).squeeze(-1)).double().numpy()
        result = classification_metrics(y, p, data.train_up_rate, bins, data.past_ret[labelled], linear_p)
        p_trade = p_scored[np.searchsorted(scored, trade)]
        result["strategy"] = long_flat_strategy(p_trade, data.ret_1[trade], cost_bps, per_year)
        out[split] = result
    return out


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """P(up) in float64 from float32 logits, as torch computes it (no overflow warning at large |logit|)."""
    return torch.sigmoid(torch.from_numpy(np.asarray(logits, dtype=np.float32))).double().numpy()


def log_symbol_summary(log, symbol: str, evaluation: dict) -> None:
    for split in ("val", "test"):
        e = evaluation[split]
        m, b, s = e["model"], e["baselines"], e["strategy"]
        auc = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        log.info("%s %s: acc %.4f (majority %.4f) bal-acc %.4f AUC %s (linear %s) log loss %.4f (base %.4f) "
                 "brier %.4f (base %.4f) | long/flat %+.2f%% vs buy&hold %+.2f%% | %s", symbol, split, m["accuracy"],
                 b["majority_class_rate"], m["balanced_accuracy"], auc(m["roc_auc"]),
                 auc(b["logistic_regression"]["roc_auc"]), m["log_loss"], b["base_rate"]["log_loss"],
                 m["brier"], b["base_rate"]["brier"], 100 * s["long_flat"]["total_return"],
                 100 * s["buy_and_hold"]["total_return"], e["skill"]["verdict"])


def evaluate_run(run_dir: str, symbols: str | None = None, checkpoint: str = "best", device: str = "auto",
                 log=print) -> dict:
    """`trainers lstm evaluate`: the metrics of every symbol of a job that has a checkpoint (or the
    ones named), e.g. those a signal stopped before their evaluation; rewrites the job summary."""
    from pathlib import Path

    from trainers.errors import UsageError
    from trainers.lstm.config import LstmConfig, job_symbols
    from trainers.runtime.results import read_results
    from trainers.runtime.rundir import exclusive, load_run_config

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, LstmConfig)
    job = read_results(run_dir)
    if not job.get("job"):
        raise UsageError(f"--run-dir {run_dir} holds no lstm job results.json; point it at the folder "
                         f"`trainers lstm train` wrote")
    wanted = job_symbols(job, symbols)
    with exclusive(run_dir):  # it writes results into the job's folders: not while training (or another) does
        return _evaluate_symbols(run_dir, cfg, wanted, checkpoint, device, log)


def _evaluate_symbols(run_dir, cfg, wanted: list[str], checkpoint: str, device: str, log) -> dict:
    import dataclasses

    from trainers.errors import UsageError
    from trainers.lstm.build import build_model
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.features import build_symbol_data
    from trainers.lstm.job import prepare_job, symbol_dir
    from trainers.lstm.summary import refresh_job_summary
    from trainers.runtime.dist import pick_device
    from trainers.runtime.results import merge_results
    from trainers.runtime.rundir import load_checkpoint_states, load_run_config

    with_checkpoint = [s for s in wanted if any((symbol_dir(run_dir, s) / "checkpoints").glob("meta_*.json"))]
    if not with_checkpoint:
        raise UsageError(f"no symbol of {', '.join(wanted[:10])} has a checkpoint yet; train first")
    plan = prepare_job(dataclasses.replace(cfg, symbols=",".join(with_checkpoint), tickers_file=None), log=log)
    dev = pick_device(0, device)
    out = {}
    for s in with_checkpoint:
        folder = symbol_dir(run_dir, s)
        scfg = load_run_config(folder, LstmConfig)
        step, states = load_checkpoint_states(folder, checkpoint, str(dev))
        data = build_symbol_data(plan.bars[s], scfg, plan.timeframes).to(dev)
        model = build_model(scfg, data.n_features).to(dev)
        model.load_state_dict(states["model"])
        evaluation = evaluate_symbol(model, data, scfg.eval_batch_size, scfg.cost_bps, scfg.calibration_bins)
        evaluation["checkpoint_step"] = step
        merge_results(folder, {"evaluation": evaluation})
        out[s] = evaluation
        log(f"{s}: checkpoint step {step}; test {evaluation['test']['skill']['verdict']}")
    refresh_job_summary(run_dir)
    return out
