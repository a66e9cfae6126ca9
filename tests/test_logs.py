"""sparkgnn.logs: library code logs under the `sparkgnn` loggers and prints nothing itself; a command
line's install_cli_handler prints each line once, to the stream of the moment, however often it
is called."""

import logging

import pytest
import torch
from torch_geometric.nn import GraphSAGE

from sparkgnn.datasets.synthetic import synthetic_graph
from sparkgnn.logs import CLI_HANDLER, LOGGER, install_cli_handler
from sparkgnn.models import Model


def _cli_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger(LOGGER).handlers if h.get_name() == CLI_HANDLER]


def test_the_handler_is_installed_once_and_prints_each_line_once(capsys):
    first = install_cli_handler()
    assert install_cli_handler(logging.WARNING) is first and _cli_handlers() == [first]
    logging.getLogger("sparkgnn.engine.api").info("hidden at WARNING")
    install_cli_handler()
    logging.getLogger("sparkgnn.engine.api").info("sparkgnn: one line")
    logging.getLogger("elsewhere").warning("not a sparkgnn line")
    captured = capsys.readouterr()
    assert captured.out == "sparkgnn: one line\n"
    assert "one line" not in captured.err


def test_stderr_and_a_prefix_for_the_messenger_command_lines(capsys):
    install_cli_handler(stream="stderr", prefix="[sparkgnn-worker] ")
    logging.getLogger("sparkgnn.messenger.worker_loop").warning("lost the broker at tcp://x: 100%")
    captured = capsys.readouterr()
    assert captured.err == "[sparkgnn-worker] lost the broker at tcp://x: 100%\n" and captured.out == ""


def test_a_bad_stream_is_refused():
    with pytest.raises(ValueError, match="stream must be one of stdout, stderr"):
        install_cli_handler(stream="stdlog")
    assert _cli_handlers() == []


def test_a_library_call_logs_and_prints_nothing(tmp_path, capsys, caplog):
    from sparkgnn.pe.local import precompute_local

    assert _cli_handlers() == []
    torch.manual_seed(0)
    model = Model.from_pyg(GraphSAGE(4, 4, 2).eval())
    caplog.set_level(logging.INFO, logger=LOGGER)
    precompute_local(synthetic_graph(40, 160, 4, seed=1), model, str(tmp_path / "store"))
    assert capsys.readouterr().out == ""
    (record,) = [r for r in caplog.records if r.name == "sparkgnn.pe.local"]
    assert record.levelno == logging.INFO and record.getMessage().startswith("sparkgnn precompute_local: 2 layers")


def test_a_jobs_progress_reaches_the_engine_loggers(spark, tmp_path, capsys, caplog):
    from sparkgnn import infer
    from sparkgnn.graph import write_graph_dir

    graph_dir = str(tmp_path / "graph")
    write_graph_dir(synthetic_graph(60, 240, 4, seed=2), graph_dir)
    torch.manual_seed(1)
    caplog.set_level(logging.INFO, logger=LOGGER)
    infer(spark, graph_dir, Model.from_pyg(GraphSAGE(4, 4, 2).eval()), partitions=2, work_dir=str(tmp_path / "w"))
    assert capsys.readouterr().out == ""
    engine = [r for r in caplog.records if r.name.startswith("sparkgnn.engine.")]
    messages = [r.getMessage() for r in engine]
    assert any(m.startswith("sparkgnn: prepared graph") for m in messages), messages
    assert any(m.startswith("sparkgnn: cost model:") for m in messages), messages
    assert {r.name for r in engine} >= {"sparkgnn.engine.prepare", "sparkgnn.engine.api", "sparkgnn.engine.executor"}
