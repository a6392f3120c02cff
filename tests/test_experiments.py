"""experiments.py --list: the tables first, one line each (name, what it measures, runs); --list NAME: one table's
train.py commands."""

import pytest

import experiments


def listed(capsys, *argv):
    experiments.main(["--list", *argv])
    return capsys.readouterr().out.splitlines()


def test_list_shows_one_line_a_table(capsys):
    lines = listed(capsys)
    assert lines[0].startswith("the tables (seeds 0,1,2;")
    assert [line.split()[0] for line in lines[1:]] == list(experiments.TABLES)
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert by_name["ptb"].endswith("Penn Treebank, word level [15 runs + 9 evaluations]")    # 5 rows, 3 seeds
    assert by_name["depth"].endswith("[36 runs]") and "SimpleTRON §5.2" in by_name["depth"]
    assert by_name["deq-grid"].endswith("[computed here, no training]")
    assert "python train.py" not in "\n".join(lines)
    assert listed(capsys, "--seeds", "4")[2].endswith("[5 runs + 3 evaluations]")


def test_list_of_one_table_gives_its_commands(capsys):
    lines = listed(capsys, "transfer", "--seeds", "0,1")
    assert lines[0].startswith("transfer: Attention transfer (SimpleTRON §4.2)")
    commands = [line.strip() for line in lines if line.strip().startswith("python train.py")]
    assert len(commands) == 6 and commands[0].endswith("--seed 0 --out_dir out/exp/transfer/simpletron-s0")
    assert lines[-1].endswith("python analyze.py curves --table transfer")
    experiments.main(["depth", "--list"])                                  # the table named before --list
    assert capsys.readouterr().out.startswith("depth: Depth (SimpleTRON §5.2)")
    with pytest.raises(SystemExit, match="choose a table"):
        experiments.main(["--list", "nothing"])
