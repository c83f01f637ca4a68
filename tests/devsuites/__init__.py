"""PyTorch's own device-generic test suites, run on a reference device (``edref``; ``edprims``).

Backend teams judge a device by PyTorch's device-generic unit tests
(``instantiate_device_type_tests``, instantiated for PrivateUse1). This package
runs three of those files (``../shared/data/pytorch-tests/``, PyTorch 2.4.0's, not
ours to ship) from a temporary copy: once on CPU (the control) and once on
``edref`` with ``ed.enable("edref")`` (``--device edprims``: on the prims reference device),
and compares the two against :mod:`tests.devsuites.known`.

``python -m tests.devsuites`` (``make devsuites``) runs every device-type test of
the three files; ``tests/test_devsuites.py`` runs a fixed slice in ``make test``.
:mod:`tests.devsuites.plugin` is the pytest plugin loaded into both runs: it
registers the device before the test modules are imported, aliases the helper
names that moved since 2.4, records each test's outcome, and checks after every
test that the dispatch state is what it was before.
"""
