`timescale 1ns/1ps
module tb;
  reg clk = 0, rst_n = 0, start = 0, din = 0;
  wire busy;
  fsm uut (.clk(clk), .rst_n(rst_n), .start(start), .din(din), .busy(busy));
  always #5 clk = ~clk;
  initial begin
    #12 rst_n = 1;
    @(negedge clk) start = 1; din = 1;   // IDLE -> RUN
    @(negedge clk) start = 0;            // RUN -> DONE (din = 1)
    @(negedge clk);                      // DONE -> IDLE
    @(negedge clk) din = 0;
    @(negedge clk);
    $finish;
  end
endmodule
