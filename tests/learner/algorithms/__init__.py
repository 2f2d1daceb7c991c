"""Tests of learner.algorithms: pure tensor functions."""
