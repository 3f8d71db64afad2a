"""A hardware-in-the-loop test: the device's answers against the bundle's golden vectors.

Run it against a bundle written by `edgedeploy export ... --golden N --data DATA.npz`:

    pytest examples/hil --edgedeploy-bundle FWDIR [--edgedeploy-max-abs-diff 1]

`device` (see conftest.py) is the transport: a callable taking the input bytes
and returning the output bytes.
"""

from edgedeploy.hil.testing import assert_matches_golden


def test_output_matches_golden(device, golden_bundle, golden_case, golden_tolerance):
    """Each golden case: every output element within the tolerance (default: bit-exact)."""
    output = device(golden_case.input_bytes())
    assert_matches_golden(output, golden_bundle, golden_case, max_abs_diff=golden_tolerance)


def test_top1_matches_golden(device, golden_bundle):
    """All cases together: the device picks the same class as the reference."""
    picks = [golden_bundle.decode_outputs(device(c.input_bytes()))[0].argmax() for c in golden_bundle]
    assert picks == [c.argmax for c in golden_bundle]
