import http.server
import threading

import pandas as pd
import pytest

from trainers.cli import main
from trainers.errors import UsageError
from trainers.market.sources import DataRequest, load_source
from trainers.market.synthetic import synthetic_market


def long_table(n_tickers=3, n_days=400):
    return synthetic_market(n_tickers, n_days, seed=2)


def test_file_source_reads_csv_with_any_column_case(tmp_path):
    frame = long_table()
    frame.columns = [c.upper() for c in frame.columns]
    path = tmp_path / "prices.csv"
    frame.to_csv(path, index=False)
    out, info = load_source(DataRequest(source=f"file:{path}", min_rows=100))
    assert list(out.columns) == ["date", "ticker", "open", "high", "low", "close", "volume"]
    assert info["tickers_used"] == ["SYN000", "SYN001", "SYN002"] and info["synthetic"] is False
    assert len(out) == len(frame) and info["validation"]["rows_dropped"] == 0


def test_file_source_parquet_with_ticker_selection_and_dates(tmp_path):
    path = tmp_path / "prices.parquet"
    long_table().to_parquet(path)
    out, info = load_source(DataRequest(source=f"file:{path}", tickers=["SYN001", "ZZZ"], start="2000-03-01",
                                        end="2001-01-01", min_rows=100), log=lambda m: None)
    assert set(out["ticker"]) == {"SYN001"} and info["tickers_missing"] == ["ZZZ"]
    assert out["date"].min() >= pd.Timestamp("2000-03-01") and out["date"].max() < pd.Timestamp("2001-01-01")


@pytest.mark.parametrize("content,name,match", [
    ("date,ticker,open,high,low,volume\n2020-01-01,A,1,1,1,1\n", "p.csv", "lacks column.*close"),
    ("x", "p.txt", "unknown format '.txt'"),
    ("date,ticker,open,high,low,close,volume\nnot-a-date,A,1,1,1,1,1\n", "p.csv", "unparseable|could not"),
])
def test_bad_files_get_clear_errors(tmp_path, content, name, match):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(UsageError, match=match):
        load_source(DataRequest(source=f"file:{path}"))
    with pytest.raises(UsageError, match="no such file"):
        load_source(DataRequest(source=f"file:{tmp_path / 'missing.csv'}"))


def test_cache_source_without_a_cache_points_at_fetch(tmp_path):
    with pytest.raises(UsageError, match="fetch-sp500"):
        load_source(DataRequest(source="cache", cache_dir=str(tmp_path / "none")))


def test_fetch_cli_rejects_cache_as_a_fetch_source(tmp_path, capsys):
    assert main(["fetch-sp500", "--source", "cache", "--cache-dir", str(tmp_path)]) == 2
    assert "fetch-sp500 fills it" in capsys.readouterr().err


WIKI_LIKE = """<html><body><table class="wikitable" id="constituents">
<tr><th>Symbol</th><th>Security</th><th>GICS Sector</th><th>GICS Sub-Industry</th><th>Date added</th></tr>
<tr><td>AAPL</td><td>Apple Inc.</td><td>Information Technology</td><td>x</td><td>1982-11-30</td></tr>
<tr><td>BRK.B</td><td>Berkshire Hathaway</td><td>Financials</td><td>x</td><td>2010-02-16</td></tr>
<tr><td>XOM</td><td>ExxonMobil</td><td>Energy</td><td>x</td><td>1957-03-04</td></tr>
</table></body></html>"""


@pytest.fixture
def local_page():
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = WIKI_LIKE.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/sp500"
    server.shutdown()


def test_refresh_universe_from_a_constituents_page(tmp_path, local_page, capsys):
    out = tmp_path / "sp500.csv"
    assert main(["refresh-universe", "--url", local_page, "--output", str(out)]) == 0
    u = pd.read_csv(out, dtype=str, keep_default_na=False)
    assert u["symbol"].tolist() == ["AAPL", "BRK-B", "XOM"]
    assert u.loc[u["symbol"] == "XOM", "gics_sector"].item() == "Energy"


def test_refresh_universe_offline_keeps_the_file(tmp_path, capsys):
    out = tmp_path / "sp500.csv"
    out.write_text("keep me")
    assert main(["refresh-universe", "--url", "http://127.0.0.1:9/none", "--output", str(out)]) == 2
    assert "no network?" in capsys.readouterr().err and out.read_text() == "keep me"
