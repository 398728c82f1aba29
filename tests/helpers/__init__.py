"""What tests of every layer share: servers, waiting, desks, the browser and the raw Gradio queue."""
