"""Calibration: measured costs (a versioned profile) that replace catalog defaults."""
