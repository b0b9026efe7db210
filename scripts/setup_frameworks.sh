#!/usr/bin/env bash
# Create .venv-frameworks: the project plus the RL frameworks its adapters plug into (verl with its v1 trainer's
# transferqueue, SkyRL-gym, OpenEnv, OpenRLHF, GEM, NeMo-Gym, verifiers), for tests/test_adapter_*.py. A separate venv because verl declares
# transformers<5.11 while the project needs >=5.19:
# verl goes in with --no-deps plus what `verl.experimental.agent_loop` imports, and its agent loop runs on 5.24.
# slime is not on PyPI (its tests use a stand-in of its Sample). Idempotent: re-runs only when pyproject.toml,
# constraints.txt or this script changed. About 5 minutes and 2 GiB the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-frameworks
stamp=$venv/.retool-env-installed
want=$(cat pyproject.toml constraints.txt "$0" scripts/install.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
source scripts/install.sh
venv_bootstrap $venv
venv_install_torch $venv                # the CPU build first, so nothing below pulls a CUDA torch
pip="venv_install $venv"
$pip -e ".[dev]" skyrl-gym==0.4.0 openenv-core==0.3.0
$pip --no-deps verl==0.9.1
$pip ray==2.60.0 hydra-core==1.3.8 tensordict==0.10.0 datasets==5.2.0 codetiming==1.4.0 dill==0.4.1 \
    pandas==3.1.1 pylatexenc==2.11 pillow==12.3.0 cachetools==8.0.2 peft==0.21.2
# verl's v1 (TransferQueue) trainer, its default since 0.9: transferqueue without ray[default]'s dashboard extras.
$pip --no-deps transferqueue==0.1.11 torchdata==0.11.0
$pip pyzmq==27.3.0 msgspec==0.23.0 prometheus_client==0.26.0 psutil==7.2.2
# OpenRLHF's agent API (retool_adapters.openrlhf): its trainer pulls deepspeed, vLLM and flash-attn, but
# openrlhf.utils.agent imports only torch, transformers, sympy, pylatexenc and aiohttp, all above.
$pip --no-deps openrlhf==0.11.2
# GEM (retool_adapters.gem): gem-llm pins msgspec==0.19.0 (and nltk) for its search tool and word games only, which
# the adapter never imports; msgspec stays verl's 0.23.0. `import gem` loads reasoning-gym, installed with its deps.
$pip --no-deps gem-llm==0.1.0
$pip reasoning-gym==0.1.23
# NeMo-Gym (retool_adapters.nemo_gym): nemo-gym 0.4.0 declares Python >= 3.12 and pulls ray[default], mlflow and
# mcp<2; its resources-server code runs on 3.11 with what it imports (wandb, yappi, gprof2dot, pydot, itsdangerous).
$pip wandb==0.31.0 yappi==1.7.6 gprof2dot==2025.4.14 pydot==4.0.1 itsdangerous==2.2.0
$venv/bin/python -m pip install -q --no-deps --ignore-requires-python nemo-gym==0.4.0  # uv has no such flag
# verifiers v1 (retool_adapters.verifiers, `vf-eval retool_verifiers`): verifiers 0.4.0 pins mcp==2.0.0 and openai<3,
# which would downgrade openenv-core's mcp 2.3.0 (its fastmcp client then fails to import); v1's eval, interception
# server and trace store run on mcp 2.3.0 and openai 3.57.0 (tests/test_adapter_verifiers.py), so it goes in --no-deps.
$pip --no-deps verifiers==0.4.0
$pip aiofiles==25.1.0 anthropic==2.15.0 gepa==0.1.4 loguru==0.7.3 "prime-pydantic-config[toml]==0.4.3" prime-runs==0.1.4 \
    prime-sandboxes==0.5.1 prime-tunnel==0.1.15 "renderers[multimodal]==0.1.12"
$venv/bin/python -c "import verifiers.v1, retool_verifiers"
$venv/bin/python -c "
import openrlhf.utils.agent, gem, nemo_gym.base_resources_server
import verl.experimental.agent_loop.agent_loop, verl.trainer.ppo.v1.agent_loop_tq, verl.trainer.ppo.v1.trainer_sync
import skyrl_gym, openenv.core, uvicorn, transformers, retool_adapters
from importlib.metadata import version as v
print('verl', v('verl'), 'skyrl-gym', v('skyrl-gym'), 'openenv-core', v('openenv-core'), 'transformers', v('transformers'))"
echo "$want" > "$stamp"
