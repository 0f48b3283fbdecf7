"""What a planner asks of the simulator: optimizers side by side with paired bands (compare), the NIC
bandwidth where compression stops paying (breakeven), the parallel layouts worth simulating for a
model and cluster (layout_search), and the cheapest cluster, optimizer and layout within a deadline
(planning). They run simulations; the CLI and the Python API sit above them."""
