"""Helpers the tests share (and the demos import): tiny models of each kind, files written as
other tools write them, the chi-square test, the real models' fetch."""
