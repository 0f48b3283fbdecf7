"""Published measurements shipped as data, and the comparison of predictions against them."""
