"""A simulated cluster in virtual time (``cluster.backend = "sim"``): every role in one process,
running the real shard state, consistency controllers, aggregators, optimizers, learning rules
and push filters on real gradients, with time taken from a compute model and a network model."""
