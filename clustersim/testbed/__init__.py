"""An emulated multi-host cluster on one Linux machine: network namespaces, veth pairs, a bridge, tc."""
