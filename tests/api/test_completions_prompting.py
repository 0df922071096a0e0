"""api.prompting: chat templates rendered like transformers, token counts from tokenizer.json (no torch)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from api.prompting import DEFAULT_CHAT_TEMPLATE, BaseModelTokenizer, PromptError, load_base_tokenizer

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}]


def _model_copy(base_model_dir: Path, dest: Path, *, keep_template: bool = True) -> Path:
    dest.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copyfile(base_model_dir / name, dest / name)
    if keep_template and (base_model_dir / "chat_template.jinja").exists():
        shutil.copyfile(base_model_dir / "chat_template.jinja", dest / "chat_template.jinja")
    return dest


def test_matches_transformers_apply_chat_template(base_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    ours = BaseModelTokenizer.load(base_model_dir)
    hf = AutoTokenizer.from_pretrained(str(base_model_dir))
    expected_text = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    text, ids = ours.encode_chat(MESSAGES)
    assert text == expected_text
    assert ids == hf(expected_text, add_special_tokens=False)["input_ids"]
    assert ours.encode("hello world") == hf("hello world")["input_ids"]
    assert (
        ours.max_context_tokens
        == json.loads((base_model_dir / "config.json").read_text())["max_position_embeddings"]
    )


def test_template_in_tokenizer_config_gets_special_tokens_and_helpers(
    base_model_dir: Path, tmp_path: Path
) -> None:
    model = _model_copy(base_model_dir, tmp_path / "m", keep_template=False)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["bos_token"] = {"content": "<s>", "lstrip": False}  # older AddedToken layout
    config["chat_template"] = [
        {"name": "tool_use", "template": "unused"},
        {
            "name": "default",
            "template": "{{ bos_token }}{% for m in messages %}{{ m['content'] | tojson }}\n"
            "{% endfor %}{% if add_generation_prompt %}>{% endif %}",
        },
    ]
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = BaseModelTokenizer.load(model)
    assert tokenizer.render_chat([{"role": "user", "content": "é<b>"}]) == '<s>"é<b>"\n>'


def test_default_template_when_the_tokenizer_has_none(base_model_dir: Path, tmp_path: Path) -> None:
    tokenizer = BaseModelTokenizer.load(_model_copy(base_model_dir, tmp_path / "m", keep_template=False))
    assert not tokenizer.has_own_chat_template and tokenizer.chat_template == DEFAULT_CHAT_TEMPLATE
    assert tokenizer.render_chat([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_text_content_parts_are_joined_and_other_parts_refused(base_model_dir: Path) -> None:
    tokenizer = BaseModelTokenizer.load(base_model_dir)
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]
    assert tokenizer.render_chat([{"role": "user", "content": parts}]) == tokenizer.render_chat(
        [{"role": "user", "content": "hello world"}]
    )
    with pytest.raises(PromptError, match="only text parts"):
        tokenizer.render_chat(
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
        )
    with pytest.raises(PromptError, match="role must be one of"):
        tokenizer.render_chat([{"role": "wizard", "content": "hi"}])
    with pytest.raises(PromptError, match="at least one message"):
        tokenizer.render_chat([])


def test_template_raise_exception_becomes_a_prompt_error(base_model_dir: Path, tmp_path: Path) -> None:
    model = _model_copy(base_model_dir, tmp_path / "m", keep_template=False)
    (model / "chat_template.jinja").write_text("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(PromptError, match="roles must alternate"):
        BaseModelTokenizer.load(model).render_chat([{"role": "user", "content": "x"}])


def test_no_model_dir_means_no_tokenizer(tmp_path: Path) -> None:
    assert load_base_tokenizer(None) is None
    assert load_base_tokenizer(tmp_path) is None
