"""Wire models, error codes and settings shared by every laneway process."""
