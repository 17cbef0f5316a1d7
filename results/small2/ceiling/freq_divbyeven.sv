module tb;
  reg clk = 0, rst_n = 0; wire clk_div;
  freq_divbyeven uut(.clk(clk), .rst_n(rst_n), .clk_div(clk_div));
  always #1 clk = ~clk;
  initial begin
    #5 rst_n = 1; #100 rst_n = 0; #5 rst_n = 1; #100;
    $finish;
  end
endmodule
