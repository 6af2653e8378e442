"""The engine's intermediate representation: the op table (:mod:`.ops`), the graph the search
rewrites (:mod:`.graph`) and the bridge between Relax dataflow blocks and that graph
(:mod:`.relax_bridge`)."""
