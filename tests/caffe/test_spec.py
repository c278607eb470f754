"""Typed net specs: field validation, V1 → V2 and other upgrades, phase/stage filtering."""

from __future__ import annotations

import pytest

from sparkdp.caffe.spec import NetState, ParamSpec, StateRule, filter_layers, load_net_spec
from sparkdp.errors import ConfigError

V1_NET = """
name: "old"
input: "data"
input_dim: 10 input_dim: 3 input_dim: 8 input_dim: 8
layers {
  name: "conv" type: CONVERTE bottom: "data" top: "conv"
}
"""


def test_v2_layer_fields():
    spec = load_net_spec(
        """
        name: "n"
        layer { name: "c" type: "Convolution" bottom: "d" top: "c" phase: TRAIN
                param { lr_mult: 1 decay_mult: 1 name: "w" } param { lr_mult: 2 decay_mult: 0 share_mode: PERMISSIVE }
                loss_weight: 0.5
                convolution_param { num_output: 4 kernel_size: 3 } exclude { stage: "deploy" } }
        """
    )
    (layer,) = spec.layers
    assert (layer.name, layer.type, layer.bottoms, layer.tops, layer.phase) == (
        "c",
        "Convolution",
        ["d"],
        ["c"],
        "TRAIN",
    )
    assert layer.params == [ParamSpec("w", 1, 1, None), ParamSpec("", 2, 0, "PERMISSIVE")]
    assert layer.loss_weights == [0.5]
    assert layer.sub("convolution_param").get("num_output") == 4
    assert layer.sub("pooling_param").fields == []
    assert layer.exclude == [StateRule(stage=["deploy"])]
    assert spec.state == NetState("TEST", 0, ())


def test_unknown_field_suggests_nearest():
    with pytest.raises(
        ConfigError,
        match=r"<string>:1:59: unknown field 'kernal_size' in ConvolutionParameter\. "
        r"Did you mean 'kernel_size'\?",
    ):
        load_net_spec('layer { name: "c" type: "Convolution" convolution_param { kernal_size: 3 } }')
    with pytest.raises(ConfigError, match="unknown field 'bottoms' in LayerParameter. Did you mean 'bottom'"):
        load_net_spec('layer { name: "c" bottoms: "x" }')
    with pytest.raises(ConfigError, match="unknown field 'std_dev' in FillerParameter. Did you mean 'std'"):
        load_net_spec('layer { name: "c" inner_product_param { weight_filler { std_dev: 1 } } }')
    with pytest.raises(
        ConfigError, match="<string>:1:1: unknown field 'layerz' in NetParameter. Did you mean 'layer'"
    ):
        load_net_spec("layerz { }")


def test_message_vs_value_mismatch():
    with pytest.raises(ConfigError, match="field 'name' of LayerParameter takes a value, not a message"):
        load_net_spec("layer { name { } }")
    with pytest.raises(ConfigError, match="field 'convolution_param' of LayerParameter must be a message"):
        load_net_spec("layer { convolution_param: 3 }")


def test_v1_upgrade_maps_types_params_and_transform():
    spec = load_net_spec(
        """
        layers { name: "d" type: DATA top: "data" top: "label"
                 data_param { source: "x" batch_size: 4 scale: 0.5 crop_size: 3 mirror: true }
                 include { phase: TRAIN } }
        layers { name: "c" type: CONVOLUTION bottom: "data" top: "c" blobs_lr: 1 blobs_lr: 2
                 weight_decay: 1 weight_decay: 0 param: "cw" param: "cb" blob_share_mode: STRICT
                 convolution_param { num_output: 2 kernel_size: 1 } }
        layers { name: "l" type: 21 bottom: "c" bottom: "label" top: "loss" }
        """
    )
    data, conv, loss = spec.layers
    assert (data.type, conv.type, loss.type) == ("Data", "Convolution", "SoftmaxWithLoss")
    assert data.sub("data_param").names() == ["source", "batch_size"]
    transform = data.sub("transform_param")
    assert (transform.get("scale"), transform.get("crop_size"), transform.get("mirror")) == (0.5, 3, True)
    assert conv.params == [ParamSpec("cw", 1.0, 1.0, "STRICT"), ParamSpec("cb", 2.0, 0.0, None)]
    assert data.include == [StateRule(phase="TRAIN")]


def test_v2_data_param_fields_are_not_moved():
    spec = load_net_spec('layer { name: "d" type: "Data" top: "x" data_param { scale: 0.5 } }')
    assert spec.layers[0].sub("data_param").get("scale") == 0.5
    assert not spec.layers[0].param.has("transform_param")


def test_v1_errors():
    with pytest.raises(ConfigError, match="unknown V1 layer type 'CONVERTE'"):
        load_net_spec(V1_NET)
    with pytest.raises(ConfigError, match="mixes V1 'layers {}' and V2 'layer {}'"):
        load_net_spec('layer { name: "a" } layers { name: "b" type: RELU }')
    with pytest.raises(ConfigError, match="V0 layer definitions"):
        load_net_spec('layers { layer { name: "a" type: "conv" } }')


def test_input_header_upgrade():
    spec = load_net_spec(V1_NET.replace("CONVERTE", "CONVOLUTION"))
    head = spec.layers[0]
    assert (head.name, head.type, head.tops) == ("input", "Input", ["data"])
    assert [s.getall("dim") for s in head.sub("input_param").getall("shape")] == [[10, 3, 8, 8]]
    spec = load_net_spec(
        'input: "a" input: "b" input_shape { dim: 1 dim: 2 } input_shape { dim: 3 }\n'
        'layer { name: "x" type: "ReLU" bottom: "a" top: "a" }'
    )
    assert spec.layers[0].tops == ["a", "b"] and len(spec.layers) == 2
    assert [s.getall("dim") for s in spec.layers[0].sub("input_param").getall("shape")] == [[1, 2], [3]]
    assert load_net_spec('input: "legacy"\nlayer { name: "x" }').layers[0].name == "x"  # no dims: stripped
    with pytest.raises(ConfigError, match="input_dim needs 4 values"):
        load_net_spec('input: "a"\ninput_dim: 1 input_dim: 2\n')
    with pytest.raises(ConfigError, match="either input_shape or the deprecated input_dim"):
        load_net_spec('input: "a"\ninput_dim: 1 input_shape { dim: 1 }\n')


def test_batchnorm_param_upgrade_and_rule_conflicts():
    spec = load_net_spec('layer { name: "bn" type: "BatchNorm" param { lr_mult: 1 } param { } param { } }')
    assert [(p.lr_mult, p.decay_mult) for p in spec.layers[0].params] == [(0.0, 0.0)] * 3
    with pytest.raises(ConfigError, match="both include and exclude"):
        load_net_spec('layer { name: "x" include { phase: TRAIN } exclude { phase: TEST } }')
    with pytest.raises(ConfigError, match="gives 2 loss_weight values for 1 tops"):
        load_net_spec('layer { name: "x" top: "t" loss_weight: 1 loss_weight: 2 }')


def _names(text: str, **state) -> list[str]:
    return [layer.name for layer in filter_layers(load_net_spec(text), NetState(**state)).layers]


def test_phase_level_stage_filtering():
    text = """
    layer { name: "always" }
    layer { name: "train" include { phase: TRAIN } }
    layer { name: "test" include { phase: TEST } }
    layer { name: "not_train" exclude { phase: TRAIN } }
    layer { name: "level2" include { min_level: 2 } }
    layer { name: "upto1" include { max_level: 1 } }
    layer { name: "st_a_b" include { stage: "a" stage: "b" } }
    layer { name: "a_not_b" include { stage: "a" not_stage: "b" } }
    layer { name: "any" include { stage: "x" } include { phase: TRAIN } }
    layer { name: "ex_a" exclude { stage: "a" } }
    """
    assert _names(text, phase="TRAIN") == ["always", "train", "upto1", "any", "ex_a"]
    assert _names(text, phase="TEST") == ["always", "test", "not_train", "upto1", "ex_a"]
    assert _names(text, phase="TEST", level=2, stages=("a",)) == [
        "always",
        "test",
        "not_train",
        "level2",
        "a_not_b",
    ]
    assert _names(text, phase="TEST", stages=("a", "b", "x")) == [
        "always",
        "test",
        "not_train",
        "upto1",
        "st_a_b",
        "any",
    ]
    with pytest.raises(ConfigError, match="phase must be 'TRAIN' or 'TEST'"):
        _names(text, phase="VAL")


def test_loads_paths_and_text(examples):
    by_path = load_net_spec(examples / "lenet.prototxt")
    by_str = load_net_spec(str(examples / "lenet.prototxt"))
    by_text = load_net_spec((examples / "lenet.prototxt").read_text())
    assert by_path.name == "LeNet" and by_path.layers == by_str.layers == by_text.layers
    assert [layer.type for layer in by_path.layers][:3] == ["Input", "Convolution", "Pooling"]
    with pytest.raises(ConfigError, match="cannot read Caffe text file"):
        load_net_spec("no_such_file.prototxt")
