"""Work on modules over SSH: the one SSH seam (:mod:`.ssh`), release push, agent deploy, broker ACL users."""
