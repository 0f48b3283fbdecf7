"""clustersim: a discrete-event performance model of distributed deep-learning training.

Data flows one way: a validated :class:`~clustersim.scenario.Scenario` and the hardware/model
catalogs feed the topology and cost models; a strategy (the optimizer) turns them into a
:class:`~clustersim.simulator.program.Program` of ops for one representative rank; the engine
executes the program and returns a :class:`~clustersim.simulator.result.SimulationResult`.
"""

__version__ = "0.1.0"
