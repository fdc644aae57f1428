"""The test suite; a package so that test modules import shared helpers as `tests.helpers`."""
