"""``longmoe generate --image FILE`` and images in ``longmoe chat`` (``--image``, ``/image PATH``): the
output equals the engine's greedy output for the same images; missing and non-image files, and
images for a text-only model, are clear errors."""

from __future__ import annotations

import sys

import pytest

from longmoe.cli import main
from longmoe.data.images import decode_image, patchify
from longmoe.serve.engine import Engine
from longmoe.serve.sampling import SamplingParams
from tests.serve.test_cli_chat import Keyboard
from tests.serve.test_serve_images import encoded

ARGS = ["--temperature", "0", "--max-tokens", "8"]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


@pytest.fixture(scope="module")
def pictures(tmp_path_factory):
    d = tmp_path_factory.mktemp("pictures")
    (d / "red.png").write_bytes(encoded("PNG", (24, 16), (220, 20, 20)))
    (d / "blue.jpg").write_bytes(encoded("JPEG", (12, 20), (20, 20, 220)))
    (d / "notes.png").write_text("a text file with an image's name")
    return d


def patches_of(engine: Engine, *files):
    return [patchify(decode_image(f.read_bytes()), engine.model.cfg.vision) for f in files]


def test_generate_with_images(vision_dir, pictures, capsys):
    red, blue = pictures / "red.png", pictures / "blue.jpg"
    argv = [
        "generate",
        "--model",
        str(vision_dir),
        "describe",
        *ARGS,
        "--image",
        str(red),
        "--image",
        str(blue),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    with Engine.from_dir(vision_dir) as e:
        want = e.generate("describe", GREEDY, images=patches_of(e, red, blue)).text
        other = e.generate("describe", GREEDY, images=patches_of(e, blue, red)).text
    assert out == want + "\n"
    assert want != other  # the images (and their order) reach the model


@pytest.mark.parametrize(
    ("name", "what"),
    [("missing.png", "missing.png: no such file"), ("notes.png", "notes.png: not an image")],
)
def test_generate_bad_image_files(vision_dir, pictures, capsys, name, what):
    argv = ["generate", "--model", str(vision_dir), "x", *ARGS, "--image", str(pictures / name)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("longmoe generate: error: --image: ") and what in err


def test_generate_image_limits_and_text_only_models(vision_dir, model_dir, pictures, capsys):
    red = str(pictures / "red.png")
    assert (
        main(["generate", "--model", str(vision_dir), "x", *ARGS, "--image", red, "--max-image-kb", "0"]) == 2
    )
    assert "max_image_bytes: expected an integer >= 1" in capsys.readouterr().err
    assert main(["generate", "--model", str(vision_dir), "x", *ARGS, "--image", red, "--max-images", "1",
                 "--image", red]) == 2  # fmt: skip
    assert "2 images, more than the limit of 1" in capsys.readouterr().err
    assert main(["generate", "--model", str(model_dir), "x", *ARGS, "--image", red]) == 2
    assert "reads text only" in capsys.readouterr().err


def chat_reply(vision_dir, messages, files) -> str:
    with Engine.from_dir(vision_dir) as e:
        images = patches_of(e, *files)
        return e.generate(e.encode_chat(messages, images=images), GREEDY, images=images).text


def test_chat_attaches_images(vision_dir, pictures, capsys, monkeypatch):
    red, blue = pictures / "red.png", pictures / "blue.jpg"
    lines = [f"/image {pictures / 'missing.png'}\n", f"/image {blue}\n", "what now?\n", "/exit\n"]
    monkeypatch.setattr(sys, "stdin", Keyboard(*lines))
    assert main(["chat", "--model", str(vision_dir), *ARGS, "--image", str(red)]) == 0
    out, err = capsys.readouterr()
    assert "/image: " in err and "missing.png: no such file" in err
    img = {"type": "image_url", "image_url": {"url": "attached"}}
    msgs = [{"role": "user", "content": [img, img, {"type": "text", "text": "what now?"}]}]
    assert f"assistant> {chat_reply(vision_dir, msgs, [red, blue])}\n" in out
    assert "Traceback" not in err


def test_chat_images_stay_in_the_history(vision_dir, pictures, capsys, monkeypatch):
    red = pictures / "red.png"
    monkeypatch.setattr(sys, "stdin", Keyboard(f"/image {red}\n", "first\n", "second\n"))
    assert main(["chat", "--model", str(vision_dir), *ARGS]) == 0
    out = capsys.readouterr().out
    img = {"type": "image_url", "image_url": {"url": "attached"}}
    first = [{"role": "user", "content": [img, {"type": "text", "text": "first"}]}]
    r1 = chat_reply(vision_dir, first, [red])
    second = [*first, {"role": "assistant", "content": r1}, {"role": "user", "content": "second"}]
    assert f"assistant> {chat_reply(vision_dir, second, [red])}\n" in out
