"""chorus-mini: the command line over the whole kit.

Subcommands so far:
    eval      score a model (+ adapter) on a task file: direct and agentic Pass@k / Cov@k / SynPass
              python chorus_mini.py eval --tasks TASKS.jsonl --out runs/eval_base [--adapter A] [--n 5 --rounds 3]
    compare   complementarity of several eval results (matrix, oracle union, heatmap)
              python chorus_mini.py compare runs/eval_a runs/eval_b --out runs/compare
    generate  write the best testbench for one design
              python chorus_mini.py generate --rtl dut.sv --top my_top [--inst uut] --out out/tb
"""
import argparse
import sys


def main(argv=None):
    import evaluate
    parser = argparse.ArgumentParser(prog="chorus_mini.py", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {
        "eval": (evaluate.add_eval_args, evaluate.cmd_eval, "score a model on a task file"),
        "compare": (evaluate.add_compare_args, evaluate.cmd_compare, "compare several eval results"),
        "generate": (evaluate.add_generate_args, evaluate.cmd_generate, "best testbench for one design"),
    }
    for name, (add_args, run, help_text) in commands.items():
        add_args(sub.add_parser(name, help=help_text))
    args = parser.parse_args(argv)
    return commands[args.command][1](args)


if __name__ == "__main__":
    sys.exit(main())
