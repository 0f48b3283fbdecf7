"""Model names: NAME-<N>L is catalog transformer NAME cut to N layers (what `calibrate model --layers N`
stores), in any case; a measurement is found under the catalog's spelling whatever a scenario writes."""

import pytest

from clustersim import catalog
from clustersim.catalog import user_catalogs
from clustersim.errors import InputError


def test_a_cut_model_is_the_model_with_fewer_layers():
    cut, whole = catalog.model("BERT-Base-2L"), catalog.model("BERT-Base")
    assert cut.layers == 2 and cut.model_copy(update={"layers": whole.layers}) == whole
    assert catalog.model_name("bert-base-2l") == "BERT-Base-2L"
    assert catalog.model_name("bert-large") == "BERT-Large"


@pytest.mark.parametrize(
    "name,says",
    [
        ("BERT-Base-0L", "unknown model"),
        ("BERT-Base-02L", "unknown model"),
        ("BERT-Base-\uff11L", "unknown model"),
        ("Foo-2L", "unknown model"),
        ("BERT-Base-13L", "BERT-Base has 12 layers, not 13"),
        ("ResNet-50-2L", "only a transformer can be cut"),
    ],
)
def test_what_is_not_a_cut_model_is_refused(name, says):
    """No zero or leading zero, no non-ASCII digit, no more layers than the model has, no CNN."""
    with pytest.raises(InputError, match=says):
        catalog.model(name)


def test_a_user_model_may_not_take_the_cut_form(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text(
        "Tiny-2L:\n  family: transformer\n  description: t\n  layers: 5\n  hidden: 32\n  heads: 2\n"
        "  ffn: 64\n  vocab: 100\n  max_positions: 16\n  style: gpt\n  default_seq_len: 16\n"
    )
    with pytest.raises(InputError, match="may not end in -<N>L") as err, user_catalogs([path]):
        pass
    assert err.value.key == "Tiny-2L" and err.value.source == str(path)
