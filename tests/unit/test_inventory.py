import pytest

from controller.inventory import InventoryError, load_inventory, parse_inventory, select

GOOD = """
[defaults]
ssh_user = "dev"
model_root = "/home/dev/models"
labels = { lab = "sh" }

[[module]]
name = "m-a01"
host = "192.0.2.11"
labels = { rack = "a" }

[[module]]
name = "m-b01"
host = "192.0.2.12"
ssh_port = 2222
labels = { rack = "b" }
model_paths = { qwen3vl = "/data/Qwen3-VL-8B" }
"""


def test_good_inventory_with_defaults(tmp_path):
    p = tmp_path / "inv.toml"
    p.write_text(GOOD)
    inv = load_inventory(p)
    a, b = inv.modules
    assert (a.ssh_user, a.ssh_port, a.labels) == ("dev", 22, {"lab": "sh", "rack": "a"})
    assert b.ssh_port == 2222 and b.model_paths == {"qwen3vl": "/data/Qwen3-VL-8B"}
    assert b.queue == "module.m-b01"


@pytest.mark.parametrize(("entry", "needle"), [
    ({"name": "a", "ssh_port": 70000}, "module 'a': field 'ssh_port'"),
    ({"name": "a b"}, "module 'a b': field 'name'"),
    ({"name": "a", "model_paths": {"qwen9": "/x"}}, "unknown model key 'qwen9'"),
    ({"name": "a", "colour": "red"}, "field 'colour'"),
    ({"name": "a", "env": {"BAD NAME": "1"}}, "field 'env'"),
    ({"host": "h"}, "module '#1': field 'name'"),
])
def test_bad_module_names_file_module_and_field(entry, needle):
    with pytest.raises(InventoryError) as e:
        parse_inventory({"module": [entry]}, "lab.toml")
    assert str(e.value).startswith("lab.toml:")
    assert needle in str(e.value)


def test_duplicate_and_malformed(tmp_path):
    with pytest.raises(InventoryError, match="duplicate module name"):
        parse_inventory({"module": [{"name": "a"}, {"name": "a"}]}, "x")
    p = tmp_path / "bad.toml"
    p.write_text("[[module]\nname=")
    with pytest.raises(InventoryError, match="bad.toml: not valid TOML"):
        load_inventory(p)
    with pytest.raises(InventoryError, match="inventory file not found"):
        load_inventory(tmp_path / "missing.toml")


def test_selectors():
    inv = parse_inventory({"module": [{"name": "a", "labels": {"rack": "1"}}, {"name": "b", "labels": {"rack": "2"}},
                                      {"name": "c", "labels": {"rack": "1"}}]})
    names = lambda sel: [m.name for m in select(inv.modules, sel)]  # noqa: E731
    assert names("all") == ["a", "b", "c"]
    assert names("c,a") == ["a", "c"]
    assert names("rack=1") == ["a", "c"]
    assert names("rack=2, a") == ["a", "b"]
    with pytest.raises(InventoryError, match="unknown module"):
        names("zz")
    with pytest.raises(InventoryError, match="no module has label rack=9"):
        names("rack=9")
    with pytest.raises(InventoryError, match="empty"):
        names(" , ")


@pytest.mark.parametrize(("value", "named"), [
    ("a\nb", "U+000A newline at position 2"),
    ("rack-a\r", "U+000D carriage return at position 7"),
    ("a\tb", "U+0009 tab"),
    ("\x1b[31mred", "U+001B escape at position 1"),
    ("a\u2028b", "U+2028 line separator"),
    ("ab\u202e", "U+202E right-to-left override"),
])
def test_a_control_character_in_a_label_value_is_refused_in_one_line(value, named):
    with pytest.raises(InventoryError) as e:
        parse_inventory({"module": [{"name": "m-a01", "labels": {"rack": value}}]}, "lab.toml")
    msg = str(e.value)
    assert "\n" not in msg and "\r" not in msg
    assert msg.startswith("lab.toml: module 'm-a01': field 'labels':") and "label 'rack'" in msg and named in msg


def test_a_control_character_in_a_default_label_names_the_module():
    with pytest.raises(InventoryError, match="module 'm-b01': field 'labels'.*label 'lab'.*newline"):
        parse_inventory({"defaults": {"labels": {"lab": "sh\n"}}, "module": [{"name": "m-b01"}]}, "lab.toml")


def test_plain_label_values_pass():
    inv = parse_inventory({"module": [{"name": "a", "labels": {"rack": "A 1 / évt2", "empty": ""}}]}, "x")
    assert inv.modules[0].labels == {"rack": "A 1 / évt2", "empty": ""}


@pytest.mark.parametrize("names", [("M01", "m01"), ("m-a01", "M-A01"), ("sim.X", "sim.x")])
def test_module_names_that_differ_only_in_case_are_refused(names):
    with pytest.raises(InventoryError) as e:
        parse_inventory({"module": [{"name": n} for n in (*names, "other")]}, "lab.toml")
    assert str(e.value) == (f"lab.toml: module {names[1]!r}: field 'name': differs from module {names[0]!r} only in "
                            "case (their queues, broker keys and folders would collide): rename one")
