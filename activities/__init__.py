"""Node-side actions: the switch activity and the snapshot backends it drives."""
