"""training/sft_trl.py: a real SFTTrainer run on replayed cold-start data, checked at the batch the loss consumes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "training" / "sft_trl.py"
CONFIGS = ROOT / "training" / "configs"
TINY = CONFIGS / "sft_tiny_cpu.yaml"


def sft_script():
    from training import sft_trl

    return sft_trl


def run_sft(tmp_path, monkeypatch, *extra: str):
    """Run the script's main in-process on the tiny CPU config, recording every batch `compute_loss` receives."""
    from trl import SFTTrainer

    batches = []
    compute_loss = SFTTrainer.compute_loss

    def recording(self, model, inputs, *args, **kwargs):
        batches.append({key: inputs[key].detach().cpu().clone() for key in ("input_ids", "attention_mask", "labels")})
        return compute_loss(self, model, inputs, *args, **kwargs)

    monkeypatch.setattr(SFTTrainer, "compute_loss", recording)
    sft_trl = sft_script()
    argv = ["--config", str(TINY), "--output_dir", str(tmp_path / "out"), "--dataset_limit", "10", *extra]
    data_args, training_args, model_args = sft_trl.make_parser().parse_args_and_config(argv)
    sft_trl.main(data_args, training_args, model_args)
    return sft_trl, data_args, batches


def test_trainer_labels_mask_prompt_and_interpreter_tokens(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    # The paper's format, whose interpreter blocks are easy to find (the hermes layout is checked below).
    sft_trl, data_args, batches = run_sft(tmp_path, monkeypatch, "--max_steps", "2", "--tool_format", "retool")
    out = tmp_path / "out"
    tok = AutoTokenizer.from_pretrained(out / "tiny-model")
    assert len(batches) == 2 and (out / "model.safetensors").exists()
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert all(entry["loss"] > 0 for entry in history if "loss" in entry)

    # What the trainer must train on: the replayed trajectories' own mask (deterministic: same data again).
    expected = {tuple(row["input_ids"]): row["assistant_masks"] for row in sft_trl.coldstart_rows(data_args, tok)}
    interpreter = {tok.convert_tokens_to_ids("<interpreter>"), tok.convert_tokens_to_ids("</interpreter>")}
    masked_interpreter_tokens = 0
    for batch in batches:
        for ids, attention, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"], strict=True):
            n = int(attention.sum())
            ids, labels = ids[:n].tolist(), labels[:n].tolist()
            mask = expected[tuple(ids)]
            assert labels == [t if m else -100 for t, m in zip(ids, mask, strict=True)]
            # Independently of the mask: the interpreter blocks and the prompt are never labelled, model text is.
            for i, token in enumerate(ids):
                if token in interpreter:
                    assert labels[i] == -100
                    masked_interpreter_tokens += 1
            trained = tok.decode([t for t in labels if t != -100])
            assert "<interpreter>" not in trained and "user question" not in trained and "\\boxed{" in trained
            first_trained = next(i for i, label in enumerate(labels) if label != -100)
            assert tok.decode(ids[:first_trained]).endswith("<|im_start|>assistant\n")
    assert masked_interpreter_tokens > 0


def test_lora_run_trains_an_adapter_with_the_same_masking(tmp_path, monkeypatch):
    _, _, batches = run_sft(tmp_path, monkeypatch, "--use_peft", "--lora_r", "8", "--lora_alpha", "16",
                            "--max_steps", "1", "--dataset_limit", "4")
    out = tmp_path / "out"
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8
    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    assert len(batches) == 1
    for batch in batches:
        trained = batch["labels"] != -100
        assert 0 < int(trained.sum()) < int(batch["attention_mask"].sum())


def test_retool_sft_rows_keep_recorded_outputs_out_of_the_loss(tiny_tok):
    sft_trl = sft_script()
    fixture = ROOT / "tests" / "fixtures" / "data" / "retool" / "train_2000.parquet"
    rows = sft_trl.coldstart_rows(sft_trl.DataArguments(dataset=str(fixture), tool_format="hermes"), tiny_tok)
    assert [row["kind"] for row in rows] == ["recorded", "recorded"] and rows[0]["num_tool_calls"] == 2
    for row in rows:
        masked = tiny_tok.decode([t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if not m])
        trained = tiny_tok.decode([t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m])
        assert "<tool_response>" in masked and "<tool_response>" not in trained and "<tool_call>" in trained
    assert "\n149\n" in tiny_tok.decode([t for t, m in zip(rows[0]["input_ids"], rows[0]["assistant_masks"],
                                                              strict=True) if not m])


@pytest.mark.parametrize("config", sorted(CONFIGS.glob("sft_*.yaml")), ids=lambda path: path.name)
def test_each_shipped_config_parses(config):
    from trl import ModelConfig, SFTConfig

    sft_trl = sft_script()
    known = {f.name for cls in (sft_trl.DataArguments, SFTConfig, ModelConfig) for f in dataclasses.fields(cls)}
    keys = set(yaml.safe_load(config.read_text()))
    assert keys <= known, f"not fields of DataArguments, SFTConfig or ModelConfig: {sorted(keys - known)}"
    # bf16 configs are for GPUs; on this CPU machine only use_cpu lets TrainingArguments validate them.
    data_args, training_args, model_args = sft_trl.make_parser().parse_args_and_config(
        ["--config", str(config), "--use_cpu", "true"])
    assert data_args.tool_format in ("retool", "hermes")
    if "qwen3_4b" in config.name:
        assert (training_args.learning_rate, training_args.lr_scheduler_type.value) == (1e-5, "cosine")
        assert training_args.num_train_epochs == 3 and training_args.max_length == 16384
        assert model_args.model_name_or_path == "Qwen/Qwen3-4B-Instruct-2507"
        assert data_args.dataset == "JoeYing/ReTool-SFT"
