"""An optional dependency missing reads as what needs it and how to install it."""

from __future__ import annotations

import json
import sys

import pytest

from scalelab.lab.core.errors import BadUsageError, import_optional


def test_an_installed_module_is_returned() -> None:
    assert import_optional("json", needed_for="x", hint="y") is json


def test_a_missing_module_names_the_need_the_import_error_and_the_fix() -> None:
    with pytest.raises(BadUsageError) as e:
        import_optional("scalelab_no_such_module", needed_for="widgets need scalelab-widgets",
                        hint="pip install scalelab-widgets")
    assert str(e.value) == ("widgets need scalelab-widgets (No module named "
                            "'scalelab_no_such_module'); pip install scalelab-widgets")


def test_a_part_raises_it_when_its_extra_is_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    from scalelab.layers.nets import onnx

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what an uninstalled module looks like
    with pytest.raises(BadUsageError) as e:
        onnx.runtime()
    message = str(e.value)
    assert message.startswith("ONNX models need onnxruntime (") and "onnxruntime" in message[29:]
    assert message.endswith("); " + onnx.INSTALL_HINT)
