"""Capacity-planning reports: self-contained HTML with plotly figures and a written recommendation."""
